"""warcore plugin for the ``acme`` attention backend (entry point ``acme``).

``acme`` copies the batch's rows of the shared tables into private buffers in its *out-graph*
init, in every mode: once the replay starts it reads nothing the scheduler writes. So it
declares the earliest boundary, ``PRE_REPLAY``, for every mode it runs, and the scheduler may
rewrite ``req_to_token`` while the graph is still replaying.

This module is what the entry point loads in every ``warcore`` process: it imports only
warcore's vocabulary (no torch, no device work); the backend class (``backend.py``, an
``AttentionBackend`` subclass with its own compute) is imported by the factory, which the engine
calls with ``pool``, ``max_bs``, ``capacity`` and ``context`` (see ``warcore.BackendSpec``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import BackendSpec, BoundaryContext, Declared, ForwardMode, SharedReadBoundary

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = [
    "BACKEND_NAME",
    "BOUNDARIES",
    "warcore_attention_backends",
    "warcore_shared_read_boundary",
]

BACKEND_NAME = "acme"
AUDITED = "warcore-acme>=0.1,<0.2"
"""The code these declarations describe: acme's backend, in this distribution's 0.1 series."""

BOUNDARIES = {
    ForwardMode.EXTEND: SharedReadBoundary.PRE_REPLAY,
    ForwardMode.DECODE: SharedReadBoundary.PRE_REPLAY,
    ForwardMode.TARGET_VERIFY: SharedReadBoundary.PRE_REPLAY,
    ForwardMode.DRAFT_EXTEND_V2: SharedReadBoundary.PRE_REPLAY,
}
"""What acme declares. Every entry is checked by ``tests/test_acme.py`` with the sanitizer."""


def _make_backend(**kwargs: Any) -> AttentionBackend:
    from warcore_acme.backend import AcmeBackend

    return AcmeBackend(**kwargs)


@warcore.hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    return [BackendSpec(BACKEND_NAME, _make_backend, "snapshots the page table before replay")]


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
) -> Declared | None:
    if backend != BACKEND_NAME:
        return None  # abstain: declarations for other backends are their authors' business
    # The out-graph init copies every row the forward needs (see backend.py): no shared read
    # is left once the replay starts, captured or eager (acme has no separate eager body, so
    # ``eager`` changes nothing). Other modes (MIXED, IDLE, DRAFT_EXTEND) are not audited:
    # abstaining leaves them UNKNOWN, the coarse fence.
    boundary = BOUNDARIES.get(forward_mode)
    return None if boundary is None else Declared(boundary, AUDITED)
