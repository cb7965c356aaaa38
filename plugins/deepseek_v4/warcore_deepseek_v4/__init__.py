"""warcore plugin for the ``deepseek_v4`` attention backend (entry point ``deepseek_v4``).

What it declares, and on whose authority (checked against sglang 0.5.23's
``DeepseekV4AttnBackend.shared_read_ends``, registry name ``dsv4``):

* ``TARGET_VERIFY`` → ``POST_REPLAY`` (its breakable-graph verify re-reads the live page table
  in every layer), ``IN_REPLAY`` under ``dspark`` (one full graph honouring the contract): as
  sglang 0.5.23. The eager verify is the same code: the same answer.
* ``DECODE`` (captured): ``IN_REPLAY``, as sglang 0.5.23: the backend follows the metadata
  contract in decode (and only there: its verify does not), which its spec declares,
  ``follows_contract={ForwardMode.DECODE}``; eager ``DECODE`` → ``IN_REPLAY`` (warcore's audit
  of the reference backend, which has no separate eager body).
* ``EXTEND`` → ``PRE_REPLAY`` with a per-batch refinement: the reference backend's sparse
  prefill re-reads the page table in every layer unless its out-graph init could snapshot the
  batch's rows (at most ``SNAPSHOT_TOKENS`` query tokens); ``refine_prefill_boundary`` withdraws
  the fast path for larger batches. sglang 0.5.23 declares ``UNKNOWN`` statically and refines
  per batch the same way; warcore's static answer is the earliest any batch may publish.

This module is what the ``warcore`` entry point loads, so it imports only warcore's vocabulary:
no torch, no device work. The backend class is imported by the factory when an engine uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import BackendSpec, BoundaryContext, Declared, ForwardMode, SharedReadBoundary

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = ["BACKEND_NAME", "warcore_attention_backends", "warcore_shared_read_boundary"]

BACKEND_NAME = "deepseek_v4"
AUDITED = "warcore-deepseek-v4>=0.1,<0.2"
"""The implementation these declarations were audited against (the backend in this package)."""

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
            models="sglang_dsv4",
            follows_contract={ForwardMode.DECODE},  # decode gathers in-graph (backend.py)
        )
    ]


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
) -> Declared | None:
    if backend != BACKEND_NAME:
        return None
    if forward_mode is ForwardMode.EXTEND:
        # The earliest a prefill may publish; the backend withdraws it per batch when the
        # batch is too large for its snapshot (refine_prefill_boundary).
        return Declared(SharedReadBoundary.PRE_REPLAY, AUDITED)
    if forward_mode is ForwardMode.TARGET_VERIFY:
        if context.algorithm in _CONTRACT_ALGORITHMS:
            return Declared(SharedReadBoundary.IN_REPLAY, AUDITED)
        # The breakable-graph verify re-reads shared state across graph segments, i.e. in
        # every layer: the reads last the whole replay.
        return Declared(SharedReadBoundary.POST_REPLAY, AUDITED)
    if forward_mode is ForwardMode.DECODE and eager:
        return Declared(SharedReadBoundary.IN_REPLAY, AUDITED)
    # A captured decode follows the metadata contract (the spec declares it); other modes
    # are not audited.
    return None
