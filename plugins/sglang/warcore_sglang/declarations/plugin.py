"""sglang's in-tree declarations as a warcore plugin (entry point ``warcore``: ``sglang``).

Every answer is asked of the installed sglang's real classes (see
:mod:`warcoreoracle.declarations.oracle`) and scoped to the code it was read from, the installed
release exactly when it is one warcore-sglang audited: ``Declared(boundary, "sglang===0.5.22")``.
Under any other sglang release the declarations are stale (not applied: coarse fence; ``warcore
check``
reports them) and the publish-phase and event-owner answers abstain.

Names (sglang's meet warcore's through the ``sglang_`` prefix; no clash with the reference
engine's ``trtllm_mha`` / ``deepseek_v4``, whose specs say which sglang backend they model):

=================================  ==========================================================
warcore name                       sglang
=================================  ==========================================================
``sglang_<name>``                  attention registry name ``<name>`` (``sglang_dsv4``,
                                   ``sglang_trtllm_mha``, ``sglang_fa3``, ``sglang_flashinfer``,
                                   ``sglang_triton``, ... every name in ``ATTENTION_BACKENDS``)
``sglang_base``                    ``AttentionBackend`` (the base declaration)
``sglang_hybrid``                  ``HybridAttnBackend`` (prefill / decode backends)
``sglang_tbo``                     ``TboAttnBackend`` (two-batch overlap)
``sglang_hybrid_linear``           ``HybridLinearAttnBackend``
``sglang_dots_swa_mla``            ``DotsSWAMLAAttnBackend``
``sglang_dots_hybrid``             ``DotsHybridAttnBackend`` (declares nothing of its own)
``sglang_minimax_hybrid``          ``MiniMaxHybridAttnBackend``
``sglang_minimax_sparse``          ``MiniMaxSparseAttnBackend``
``sglang_minimax_sparse_nvfp4``    ``MiniMaxSparseNvfp4AttnBackend``
``sglang_mamba2``, ``sglang_gdn``,  the linear-attention backends of hybrid-linear models
``sglang_kda``, ``sglang_lightning``,
``sglang_short_conv``
``none``                           ``SpeculativeAlgorithm.NONE``
``sglang_<member>``                ``SpeculativeAlgorithm.<MEMBER>`` (``sglang_eagle``,
                                   ``sglang_eagle3``, ``sglang_dflash``, ``sglang_dspark``,
                                   ``sglang_uno``, ``sglang_ngram``, ``sglang_standalone``,
                                   ``sglang_frozen_kv_mtp``)
``sglang_<name>``                  a custom algorithm registered through ``spec_registry``
=================================  ==========================================================

A wrapper's children are named by engine flags (``sglang_hybrid_prefill=trtllm_mha``,
``sglang_hybrid_decode=dsv4``, ``sglang_spec_attn_is_decode``, ``sglang_tbo_child``,
``sglang_hybrid_linear_full``/``_linear``, ``sglang_dots_swa_mla_backend``,
``sglang_minimax_dense``; this plugin declares them). What it answers:

* ``warcore_shared_read_boundary``: the backend's real ``shared_read_ends(mode)`` (it declares
  the captured graph: sglang publishes nothing for eager decodes; prefill is never captured).
* ``warcore_is_war_publish_phase``: ``EXTEND`` -> the algorithm's real
  ``supports_prefill_shared_read_done()``; ``DECODE``, ``TARGET_VERIFY``, ``DRAFT_EXTEND_V2``
  (and the other sglang modes) -> ``True``: in no audited release does a runner gate those on the
  algorithm,
  each publishes what its backend declares and the event owner decides whose event the
  barrier takes. For ``none``, ``EXTEND`` and ``DECODE`` only (the core answers the rest).
* ``warcore_step_event_owner``: what the algorithm's real worker class
  (``SpeculativeAlgorithm.create_worker``; ``TpModelWorker`` for ``none``) returns from
  ``last_shared_read_runner`` for the facts, on a bare worker (``draft_extend_staged`` selects
  the multi-layer EAGLE worker, the one whose draft-extend can be staged).

Vetoes need nothing here: sglang's host/storage KV offload rule (hierarchical cache, its
storage backend, LMCache) is warcore's built-in veto on the flags ``hicache``,
``hicache_storage`` and ``lmcache``, which the activation fills from sglang's server args.

Importing this module imports neither sglang nor torch: the hooks import sglang on first use.
Where sglang is not installed every hook abstains; where it is installed but cannot be imported,
the registry hooks fail (``warcore check`` reports it) and the others abstain.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Iterable
from typing import Any

import warcore
from warcore import (
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
    Declared,
    FlagSpec,
    ForwardMode,
    StepFacts,
)
from warcore.core import validate_name

from .names import BASE, FLAG_SPECS, LEAVES, PREFIX, WRAPPERS

__all__ = [
    "PLUGIN_NAME",
    "warcore_attention_backends",
    "warcore_engine_flags",
    "warcore_is_war_publish_phase",
    "warcore_shared_read_boundary",
    "warcore_speculative_algorithms",
    "warcore_step_event_owner",
]

PLUGIN_NAME = "sglang"
"""The entry-point name: provenance reads ``plugin:sglang``."""

logger = logging.getLogger("warcore.sglang")


@functools.lru_cache(maxsize=1)
def _installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


@functools.lru_cache(maxsize=1)
def _stale() -> str | None:
    from .oracle import unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        logger.warning("warcore-sglang: %s; its publish-phase and owner answers abstain", reason)
    return reason


def _ours(algorithm: str) -> bool:
    """An algorithm this plugin answers for, with a supported sglang installed."""
    if algorithm != "none" and not algorithm.startswith(PREFIX):
        return False
    return _installed() and _stale() is None


def _not_buildable(name: str) -> Any:
    def factory(**kwargs: Any) -> Any:
        raise RuntimeError(
            f"{name!r} is an sglang attention backend (engine 'sglang'): sglang's ModelRunner "
            "builds it; warcore holds its declarations only, so the reference engine cannot "
            "run it"
        )

    return factory


def _children_for(name: str) -> Any:
    def children_for(forward_mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
        from .oracle import children_for as real

        return real(name, forward_mode, context)

    return children_for


@warcore.hookimpl
def warcore_engine_flags() -> Iterable[FlagSpec]:
    return [FlagSpec(name, kind, default, doc) for name, kind, default, doc in FLAG_SPECS]


def _spec(name: str, description: str, **extra: Any) -> BackendSpec:
    return BackendSpec(name, _not_buildable(name), description, engine="sglang", **extra)


@warcore.hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    if not _installed():
        return []
    from . import oracle

    try:
        names = oracle.registry_names()
    except Exception as exc:
        raise RuntimeError(
            f"sglang is installed but its attention registry cannot be imported "
            f"({type(exc).__name__}: {exc}); sglang's declarations are missing"
        ) from exc
    specs: list[BackendSpec] = []
    for sglang_name in names:
        name = PREFIX + sglang_name
        try:
            validate_name("backend", name)
        except ValueError:
            logger.warning("warcore-sglang: sglang backend %r has no valid warcore name", name)
            continue
        ref = oracle.class_ref(name)
        built = ref.rpartition(":")[2] if ref else "a class warcore-sglang does not know"
        specs.append(_spec(name, f"sglang attention backend {sglang_name!r} ({built})"))
    for name in LEAVES:
        ref = oracle.class_ref(name)  # None: a backend this release does not have
        what = "the base declaration" if name == BASE else "built by a model-level wrapper"
        if ref is not None:
            specs.append(_spec(name, f"sglang {ref.rpartition(':')[2]} ({what})"))
    for name, shape in WRAPPERS.items():
        specs.append(_spec(name, shape.description, children_for=_children_for(name)))
    return specs


@warcore.hookimpl
def warcore_speculative_algorithms() -> Iterable[AlgorithmSpec]:
    if not _installed():
        return []
    from . import oracle

    api = oracle.api()
    algorithms: list[Any] = [a for a in api.SpeculativeAlgorithm if not a.is_none()]
    algorithms += oracle.custom_algorithms()
    specs: list[AlgorithmSpec] = []
    for algo in algorithms:
        name = oracle.warcore_algorithm(algo)
        if name is None:
            logger.warning("warcore-sglang: algorithm %r has no valid warcore name", algo)
            continue
        custom = isinstance(algo, api.CustomSpecAlgo)
        what = "custom algorithm (spec_registry)" if custom else "speculative algorithm"
        specs.append(
            AlgorithmSpec(
                name,
                "sglang",
                f"sglang {what} {algo.name}: runs in sglang (declarations only here)",
                engine="sglang",
            )
        )
    return specs


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> Declared | None:
    # No `eager` argument: sglang's declarations describe the captured graph (and prefill,
    # which is never captured); an eager decode or verify is not declared by sglang.
    if not backend.startswith(PREFIX) or not _installed():
        return None
    from .oracle import declare, scope

    boundary = declare(backend, forward_mode, context)
    return None if boundary is None else Declared(boundary, scope())


@warcore.hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    if not _ours(algorithm):
        return None
    from .oracle import publish_phase

    if algorithm == "none":
        try:  # the core's own algorithm: never fail it because sglang does not import
            return publish_phase(algorithm, forward_mode)
        except Exception:
            return None
    return publish_phase(algorithm, forward_mode)


@warcore.hookimpl
def warcore_step_event_owner(algorithm: str, facts: StepFacts) -> str | None:
    if not _ours(algorithm):
        return None
    from .oracle import event_owner

    if algorithm == "none":
        try:
            return event_owner(algorithm, facts)
        except Exception:
            return None
    return event_owner(algorithm, facts)
