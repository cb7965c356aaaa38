"""A wrong plugin: declares sglang's ``torch_native`` prefill ``PRE_REPLAY``, earlier than
sglang's own ``UNKNOWN``. warcore-sglang never lets an answer be earlier than the backend's
own declaration, so the barrier must not move."""

from __future__ import annotations

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "sglang_torch_native" and forward_mode is ForwardMode.EXTEND:
        return SharedReadBoundary.PRE_REPLAY
    return None
