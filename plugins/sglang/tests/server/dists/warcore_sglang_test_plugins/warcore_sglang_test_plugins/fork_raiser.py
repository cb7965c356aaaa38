"""A broken plugin: raises whenever it is asked about the fork backend. warcore records the
failure against it (the coarse fence for that cell) and logs it by name; the server runs on."""

from __future__ import annotations

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary


class ForkAuditError(RuntimeError):
    pass


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "sglang_fork_native":
        raise ForkAuditError(f"fork_raiser cannot audit {backend} ({forward_mode.name})")
    return None
