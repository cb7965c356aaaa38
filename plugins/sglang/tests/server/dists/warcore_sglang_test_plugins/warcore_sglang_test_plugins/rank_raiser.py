"""A plugin that fails on rank 1 only, whenever it is asked about the fork backend's decode:
rank 1's answer for that cell is the coarse fence (a failure), rank 0's is sglang's own."""

from __future__ import annotations

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary

from ._rank import rank


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "sglang_fork_native" and forward_mode is ForwardMode.DECODE and rank() == 1:
        raise RuntimeError(f"rank_raiser fails on rank 1 ({backend}, {forward_mode.name})")
    return None
