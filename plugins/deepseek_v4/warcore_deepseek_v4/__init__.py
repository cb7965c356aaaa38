"""warcore plugin for the ``deepseek_v4`` attention backend (entry point ``deepseek_v4``).

This module is what the ``warcore`` entry point loads, so it imports only warcore's vocabulary:
no torch, no device work. The backend class is imported by the factory when an engine uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import BackendSpec, BoundaryContext, ForwardMode, SharedReadBoundary

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = ["BACKEND_NAME", "warcore_attention_backends", "warcore_shared_read_boundary"]

BACKEND_NAME = "deepseek_v4"

_CONTRACT_ALGORITHMS = frozenset({"dspark"})
"""Algorithms whose verify runs as one full graph that honours the metadata contract."""


def _make_backend(**kwargs: Any) -> AttentionBackend:
    from warcore_deepseek_v4.backend import DeepseekV4Backend

    return DeepseekV4Backend(**kwargs)


@warcore.hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    return [
        BackendSpec(
            BACKEND_NAME,
            _make_backend,
            "DeepSeek-V4-style attention: verify re-reads req_to_token in every layer",
        )
    ]


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend != BACKEND_NAME or forward_mode is not ForwardMode.TARGET_VERIFY:
        # Decode follows the metadata contract (core default); other modes are not audited.
        return None
    if context.algorithm in _CONTRACT_ALGORITHMS:
        return SharedReadBoundary.IN_REPLAY
    # The breakable-graph verify re-reads shared state across graph segments, i.e. in every
    # layer: the reads last the whole replay.
    return SharedReadBoundary.POST_REPLAY
