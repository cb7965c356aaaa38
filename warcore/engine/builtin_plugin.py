"""The core's own plugin, registered as ``warcore`` by every
:class:`~warcore.core.WarcorePluginManager` (it names this module,
:data:`~warcore.core.BUILTIN_MODULE`): the reference engine's algorithms ``none`` and
``eagle``, their publish phases and event owners, the core's vetoes, and the attention
backends of :mod:`warcore.attention.builtin_plugin`.

The publish-phase and owner hooks answer what the steps ``NONE_STEP`` and ``EAGLE_STEP`` say
(``warcore check`` compares them), and for sglang's facts the steps do not cover (EAGLE's owner
on a rank without a draft model, or with its draft-extend staged). Imports no engine class (nor
torch) until a drafter is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from warcore.attention.builtin_plugin import (
    warcore_attention_backends,
    warcore_shared_read_boundary,
)
from warcore.core import AlgorithmSpec, BoundaryContext, ForwardMode, StepFacts, hookimpl
from warcore.engine.steps import EAGLE_STEP, NONE_STEP

__all__ = [
    "OFFLOAD_FLAGS",
    "warcore_attention_backends",
    "warcore_fast_path_veto",
    "warcore_is_war_publish_phase",
    "warcore_shared_read_boundary",
    "warcore_speculative_algorithms",
    "warcore_step_event_owner",
]

OFFLOAD_FLAGS = ("hicache", "hicache_storage", "lmcache")
"""Context flags for host/storage KV offload (sglang's hierarchical cache, its storage backend,
LMCache; the core's ``CORE_FLAGS``): each one vetoes the prefill fast path."""

_PUBLISH_PHASES = {
    "none": frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}),
    "eagle": frozenset({ForwardMode.DRAFT_EXTEND_V2}),
}

_OFFLOAD_REASON = (
    "host/storage KV offload ({flag}) copies a stashed chunk's KV ordered only behind the "
    "schedule stream: prefill needs the whole-forward barrier"
)


def _eagle_drafter(target: Any, num_draft: int, device: Any) -> Any:
    from warcore.engine.model import DraftLlama

    return DraftLlama(target.cfg, device)


def _eagle_stager(worker: Any) -> Any:
    from warcore.engine.spec import stage_draft_extend

    return stage_draft_extend(worker)


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
            prefill_shared_read_stager=_eagle_stager,
        ),
    ]


@hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    phases = _PUBLISH_PHASES.get(algorithm)
    return None if phases is None else forward_mode in phases


@hookimpl
def warcore_fast_path_veto(forward_mode: ForwardMode, context: BoundaryContext) -> str | None:
    if forward_mode is not ForwardMode.EXTEND:
        return None
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
