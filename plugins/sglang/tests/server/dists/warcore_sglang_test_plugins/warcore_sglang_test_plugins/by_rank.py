"""A plugin whose answer depends on the rank: on rank 1 it declares the fork backend's prefill
later (``POST_REPLAY``) than rank 0 sees it (sglang's own ``PRE_REPLAY``). Two ranks of one
server then decide that cell differently: the rank check names it."""

from __future__ import annotations

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary

from ._rank import rank


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "sglang_fork_native" and forward_mode is ForwardMode.EXTEND and rank() == 1:
        return SharedReadBoundary.POST_REPLAY
    return None
