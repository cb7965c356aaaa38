"""warcore plugin for the ``trtllm_mha`` attention backend (entry point ``trtllm_mha``).

What it declares, and on whose authority (checked against sglang 0.5.23's
``TRTLLMHAAttnBackend.shared_read_ends``):

* ``EXTEND`` → ``PRE_REPLAY``: as sglang 0.5.23 (its prefill snapshots the page table during
  metadata preparation); warcore's reference backend does the same in its out-graph init.
* ``DECODE``, ``TARGET_VERIFY`` (captured): ``IN_REPLAY``, as sglang 0.5.23, because the
  backend follows the metadata contract there (its in-graph init gathers the page table, its
  layers read only that copy): its spec says so, ``follows_contract=CONTRACT_MODES``.
* ``DRAFT_EXTEND_V2`` → ``IN_REPLAY`` (``POST_REPLAY`` with the ``nccl_allgather_in_overlap``
  flag): warcore's own audit of *its reference backend*, shown by ``warcore sanitize``, finer
  than sglang 0.5.23, which declares nothing there (``UNKNOWN``, a coarse fence) and whose NCCL
  flag now only picks the DP sync group. The flag rule is the one sglang had between #34052 and
  0.5.23, kept because it is never earlier.
* Eager ``DECODE``/``TARGET_VERIFY``/``DRAFT_EXTEND_V2``: the same as the graph, because the
  reference backend has no separate eager body (warcore's audit; sglang 0.5.23 publishes
  nothing for eager forwards).

Every declaration is scoped to this distribution's 0.1 series (:class:`warcore.Declared`): the
backend code it describes lives here. This module is what the ``warcore`` entry point loads, so
it imports only warcore's vocabulary: no torch, no device work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import (
    CONTRACT_MODES,
    BackendSpec,
    BoundaryContext,
    Declared,
    ForwardMode,
    SharedReadBoundary,
)
from warcore.core import NCCL_ALLGATHER_IN_OVERLAP

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = ["BACKEND_NAME", "warcore_attention_backends", "warcore_shared_read_boundary"]

BACKEND_NAME = "trtllm_mha"
AUDITED = "warcore-trtllm-mha>=0.1,<0.2"
"""The implementation these declarations were audited against (the backend in this package)."""

_EAGER_AS_GRAPH = frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY})


def _make_backend(**kwargs: Any) -> AttentionBackend:
    from warcore_trtllm_mha.backend import TrtllmMhaBackend

    return TrtllmMhaBackend(**kwargs)


@warcore.hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    return [
        BackendSpec(
            BACKEND_NAME,
            _make_backend,
            "TRT-LLM-style MHA: prefill snapshots the page table in its out-graph init",
            models="sglang_trtllm_mha",
            follows_contract=CONTRACT_MODES,  # decode/verify: in-graph gather (backend.py)
        )
    ]


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
) -> Declared | None:
    if backend != BACKEND_NAME:
        return None
    if forward_mode is ForwardMode.EXTEND:
        # Prefill copies the rows of req_to_token it needs into private metadata during the
        # out-graph init, so the shared reads are over before the replay starts.
        return Declared(SharedReadBoundary.PRE_REPLAY, AUDITED)
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        # warcore's audit of the reference backend: its in-graph init gathers the page table.
        # With an NCCL all-gather in the overlap loop, only the end of the replay is claimed.
        # The flag is the core's (CORE_FLAGS: bool, default False; README "Engine flags"),
        # set with `--flag nccl_allgather_in_overlap`, so this plugin declares no flag.
        if context.flag(NCCL_ALLGATHER_IN_OVERLAP):
            return Declared(SharedReadBoundary.POST_REPLAY, AUDITED)
        return Declared(SharedReadBoundary.IN_REPLAY, AUDITED)
    if eager and forward_mode in _EAGER_AS_GRAPH:
        # No separate eager body: the eager run calls the same two halves.
        return Declared(SharedReadBoundary.IN_REPLAY, AUDITED)
    # A captured decode and verify follow the metadata contract, as the spec declares.
    return None
