"""The fork backend's prefill, audited: its forward reads ``req_to_token`` in every layer, so
its shared reads last the whole forward (``POST_REPLAY``), whatever the fork declares."""

from __future__ import annotations

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "sglang_fork_native" and forward_mode is ForwardMode.EXTEND:
        return SharedReadBoundary.POST_REPLAY
    return None
