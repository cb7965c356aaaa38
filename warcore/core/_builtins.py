"""The core's own plugin: the ``torch_native`` and ``flashinfer`` backends, ``none`` and ``eagle``,
and the core's vetoes.

``torch_native`` follows the metadata contract (its in-graph init gathers the batch's rows of
the page table into private buffers, and its layers read only those), and its spec says so:
``follows_contract=CONTRACT_MODES``, so a captured decode and verify are ``IN_REPLAY``
(provenance ``contract:warcore``). So does ``flashinfer``'s (its ``plan()`` reads the page
table before the replay, ``run()`` only the wrapper's copy; its other modes are
``torch_native``'s). ``torch_native``'s EAGLE draft-extend follows the same rule, which the
contract does not cover, so this plugin declares it: ``DRAFT_EXTEND_V2`` → ``IN_REPLAY``. Its
eager path runs the same two halves as its graph (the runner calls them in order; it has no
separate eager body), so its eager decode, verify and draft-extend are declared ``IN_REPLAY``
too. These are warcore's own audits of its reference backend, shown by ``warcore sanitize``;
sglang 0.5.23 declares ``UNKNOWN`` for draft-extend and publishes nothing for eager forwards.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from ._boundary import SharedReadBoundary
from ._hookspecs import hookimpl
from ._modes import CONTRACT_MODES, ForwardMode
from ._specs import OFFLOAD_FLAGS, AlgorithmSpec, BackendSpec, BoundaryContext, StepFacts
from ._steps import EAGLE_STEP, NONE_STEP

_PUBLISH_PHASES = {
    "none": frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}),
    "eagle": frozenset({ForwardMode.DRAFT_EXTEND_V2}),
}
"""What the steps ``NONE_STEP`` and ``EAGLE_STEP`` say (``warcore check`` compares them); the
hooks answer too, for sglang's facts the steps do not cover (EAGLE's owner on a rank without
a draft model, or with its draft-extend staged)."""

_TORCH_NATIVE_EAGER = frozenset(
    {ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2}
)

_OFFLOAD_REASON = (
    "host/storage KV offload ({flag}) copies a stashed chunk's KV ordered only behind the "
    "schedule stream: prefill needs the whole-forward barrier"
)


def _torch_native(**kwargs: Any) -> Any:
    from warcore.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(**kwargs)


def _hybrid(**kwargs: Any) -> Any:
    from warcore.attention.composite import HybridBackend

    return HybridBackend(**kwargs)


def _layer_hybrid(**kwargs: Any) -> Any:
    from warcore.attention.composite import LayerHybridBackend

    return LayerHybridBackend(**kwargs)


def _hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    from warcore.attention.composite import hybrid_children

    return hybrid_children(mode, context)


def _layer_hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    from warcore.attention.composite import layer_hybrid_children

    return layer_hybrid_children(mode, context)


def _flashinfer(**kwargs: Any) -> Any:
    from warcore.attention.flashinfer import FlashInferBackend

    return FlashInferBackend(**kwargs)


def _eagle_drafter(target: Any, num_draft: int, device: Any) -> Any:
    from warcore.engine.model import DraftLlama

    return DraftLlama(target.cfg, device)


@hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    specs = [
        BackendSpec(
            "torch_native",
            _torch_native,
            "portable torch attention, CPU and CUDA",
            follows_contract=CONTRACT_MODES,  # warcore's audit: warcore sanitize --all
        ),
        BackendSpec(
            "hybrid",
            _hybrid,
            "selects a child per mode: prefill / decode children (flags hybrid_*_backend)",
            children_for=_hybrid_children,
        ),
        BackendSpec(
            "layer_hybrid",
            _layer_hybrid,
            "layer i attends with child i mod n; reads end at the latest child's",
            children_for=_layer_hybrid_children,
        ),
    ]
    # find_spec looks for the package without importing it (flashinfer is heavy, CUDA only).
    if importlib.util.find_spec("flashinfer") is not None:
        specs.append(
            BackendSpec(
                "flashinfer",
                _flashinfer,
                "flashinfer paged decode, CUDA only",
                follows_contract=CONTRACT_MODES,  # plan() gathers before the replay
            )
        )
    return specs


@hookimpl
def warcore_speculative_algorithms() -> Iterable[AlgorithmSpec]:
    return [
        AlgorithmSpec("none", "none", "no speculative decoding", step=NONE_STEP),
        AlgorithmSpec(
            "eagle",
            "eagle",
            "autoregressive drafter; draft-extend after verify",
            drafter=_eagle_drafter,
            step=EAGLE_STEP,
            models="sglang_eagle",
        ),
    ]


@hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    phases = _PUBLISH_PHASES.get(algorithm)
    return None if phases is None else forward_mode in phases


@hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
) -> SharedReadBoundary | None:
    if backend != "torch_native":
        return None
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        return SharedReadBoundary.IN_REPLAY
    if eager and forward_mode in _TORCH_NATIVE_EAGER:
        return SharedReadBoundary.IN_REPLAY
    return None  # a captured decode and verify: the contract its spec declares


@hookimpl
def warcore_fast_path_veto(forward_mode: ForwardMode, context: BoundaryContext) -> str | None:
    if forward_mode is not ForwardMode.EXTEND:
        return None
    # The core's flags hicache, hicache_storage, lmcache (CORE_FLAGS: bool, default False;
    # README "Engine flags"): host/storage KV offload on.
    for flag in OFFLOAD_FLAGS:
        if context.flag(flag):
            return _OFFLOAD_REASON.format(flag=flag)
    return None


@hookimpl
def warcore_step_event_owner(algorithm: str, facts: StepFacts) -> str | None:
    if algorithm == "none":
        return "target"
    if algorithm == "eagle":
        # The draft-extend after verify is the last reader, unless this rank holds no draft
        # model (a non-last pipeline rank) or the draft-extend is staged for the next step.
        staged = facts.draft_extend_staged or not facts.has_draft_model
        return "target" if staged else "draft"
    return None
