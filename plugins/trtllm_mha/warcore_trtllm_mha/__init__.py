"""warcore plugin for the ``trtllm_mha`` attention backend (entry point ``trtllm_mha``).

This module is what the ``warcore`` entry point loads, so it imports only warcore's vocabulary:
no torch, no device work. The backend class is imported by the factory when an engine uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import BackendSpec, BoundaryContext, ForwardMode, SharedReadBoundary
from warcore.core import NCCL_ALLGATHER_IN_OVERLAP

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = ["BACKEND_NAME", "warcore_attention_backends", "warcore_shared_read_boundary"]

BACKEND_NAME = "trtllm_mha"


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
        )
    ]


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend != BACKEND_NAME:
        return None
    if forward_mode is ForwardMode.EXTEND:
        # Prefill copies the rows of req_to_token it needs into private metadata during the
        # out-graph init, so the shared reads are over before the replay starts.
        return SharedReadBoundary.PRE_REPLAY
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        # sglang's audit: with an NCCL all-gather syncing the batch inside the overlap loop,
        # draft-extend's shared reads are not confined to the in-graph init, so only the end of
        # the replay is safe; without it the in-graph init is the last shared read.
        if context.flag(NCCL_ALLGATHER_IN_OVERLAP):
            return SharedReadBoundary.POST_REPLAY
        return SharedReadBoundary.IN_REPLAY
    # Decode and verify follow the metadata contract: the core default (IN_REPLAY) applies.
    return None
