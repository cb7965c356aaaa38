"""Where a runner records its read-done event: one small pure function, no plugin calls.

The rules behind it: a record point is never earlier than the declared boundary, and a runner
publishes only for a forward that its algorithm calls its publish phase (a ``False`` or a
failed answer publishes nothing, in every mode). A captured graph with no planted node records
after the replay, as sglang 0.5.23 does (#34052 recorded ``IN_REPLAY`` before the replay
there). An eager forward's declared boundary is its eager path's (resolution gives
``POST_REPLAY`` when only the graph is declared), so the eager point right after the in-graph
init is used only when the eager path was declared ``IN_REPLAY`` on its own.
"""

from __future__ import annotations

import enum

from ._boundary import Execution, RecordPoint, SharedReadBoundary
from ._modes import ForwardMode

__all__ = [
    "RunnerKind",
    "host_release_point",
    "last_shared_read_runner",
    "record_point",
    "runner_kind_for",
    "staged_prefill_point",
]


class RunnerKind(enum.Enum):
    DECODE = "decode"
    """Decode CUDA-graph runner: ``DECODE`` and ``TARGET_VERIFY``."""
    DRAFT_EXTEND = "draft_extend"
    """EAGLE draft-extend runner: ``DRAFT_EXTEND_V2``."""
    PREFILL = "prefill"
    """Prefill runner: ``EXTEND``."""
    DRAFT_DECODE = "draft_decode"
    """A draft model's decode steps: publish only when the algorithm's publish phase is
    ``DECODE`` (a step whose draft decodes are its last reader); EAGLE's never do, its
    draft-extend after verify reads later."""

    # Identity hash (members are singletons): Enum's own __hash__ is a Python-level call, and
    # members key the per-replay decision lookup, where it cost ~0.1 µs per member.
    __hash__ = object.__hash__


def runner_kind_for(forward_mode: ForwardMode, *, draft: bool = False) -> RunnerKind:
    """The runner that executes ``forward_mode`` (modes no runner publishes for go to DECODE,
    whose decision is then ``RecordPoint.NONE``); ``draft`` for a draft model's runner."""
    if draft and forward_mode is ForwardMode.DECODE:
        return RunnerKind.DRAFT_DECODE
    if forward_mode is ForwardMode.EXTEND:
        return RunnerKind.PREFILL
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        return RunnerKind.DRAFT_EXTEND
    return RunnerKind.DECODE


_RUNNER_MODES = {
    RunnerKind.DECODE: frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY}),
    # A draft decode publishes only where its algorithm's step says it is the last reader
    # (issue 14: steps as data); EAGLE's never is, its draft-extend reads later.
    RunnerKind.DRAFT_DECODE: frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY}),
    RunnerKind.DRAFT_EXTEND: frozenset({ForwardMode.DRAFT_EXTEND_V2}),
    RunnerKind.PREFILL: frozenset({ForwardMode.EXTEND}),
}
"""The modes each runner can publish for."""


def record_point(
    kind: RunnerKind,
    forward_mode: ForwardMode,
    declared: SharedReadBoundary,
    publish_phase: bool,
    execution: Execution,
) -> RecordPoint:
    """Where ``kind``'s runner records the read-done event of one forward.

    The algorithm's gate (``publish_phase``) precedes the declaration; a mode the runner does
    not publish for records nothing. The decode, draft-decode and draft-extend runners honour
    the declared boundary with the earliest point that is not earlier than it; the prefill
    runner publishes only before its replay, for a ``PRE_REPLAY`` backend."""
    if not publish_phase or forward_mode not in _RUNNER_MODES[kind]:
        return RecordPoint.NONE
    if kind is RunnerKind.PREFILL:
        pre = declared is SharedReadBoundary.PRE_REPLAY
        return RecordPoint.PRE_REPLAY if pre else RecordPoint.NONE
    return _honour(declared, execution)


def staged_prefill_point(
    kind: RunnerKind,
    forward_mode: ForwardMode,
    declared: SharedReadBoundary,
    *,
    reads_later: bool,
    has_stager: bool,
    vetoed: bool,
) -> RecordPoint:
    """Where the prefill runner records for a batch whose later shared reads were staged.

    sglang #38554 (stage, then publish): an algorithm whose prefill has a later shared reader
    on another runner (``reads_later``: EAGLE's draft prompt pass) publishes the early prefill
    event only for a batch its ``prefill_shared_read_stager`` staged. That point is the one a
    prefill that is its own step's last reader would get (``PRE_REPLAY`` for a ``PRE_REPLAY``
    backend), and ``NONE`` for every other runner or mode, a veto (the prefill fast path
    switched off included), an algorithm that reads nothing later (it needs no staging) or
    one with no stager (it did not stage: the coarse fence, today's rule). Per batch the
    runner uses this point only when the stager answered ``True``."""
    if vetoed or not reads_later or not has_stager or kind is not RunnerKind.PREFILL:
        return RecordPoint.NONE
    return record_point(kind, forward_mode, declared, True, Execution.EAGER)


def last_shared_read_runner(owner: str | None, *, prefill_staged: bool) -> str | None:
    """The runner whose event the step's barrier takes: the target on a prefill step whose
    later reads were staged (its early record is the step's fence, sglang #38169), else the
    step's event owner (``None``: no owner, the coarse fence)."""
    return "target" if prefill_staged else owner


def _honour(declared: SharedReadBoundary, execution: Execution) -> RecordPoint:
    """The earliest record point that is not earlier than ``declared``."""
    if declared is SharedReadBoundary.UNKNOWN:
        return RecordPoint.NONE
    if declared is SharedReadBoundary.PRE_REPLAY:
        return RecordPoint.PRE_REPLAY
    if declared is SharedReadBoundary.POST_REPLAY:
        return RecordPoint.POST_REPLAY
    if execution is Execution.EAGER:
        return RecordPoint.AFTER_IN_GRAPH_INIT
    if execution is Execution.GRAPH_PLANTED:
        return RecordPoint.IN_GRAPH_NODE
    return RecordPoint.POST_REPLAY


_EAGER_POINTS = frozenset(
    {RecordPoint.PRE_REPLAY, RecordPoint.AFTER_IN_GRAPH_INIT, RecordPoint.POST_REPLAY}
)
"""Record points the host launches between a forward's phases (not inside a replay)."""


def host_release_point(
    point: RecordPoint, host_reads_until: SharedReadBoundary | None
) -> RecordPoint:
    """Where the host may rewrite the staged host buffers of a forward recorded at ``point``.

    Every forward reads its staged inputs in ``load_batch`` (``PRE_REPLAY``); a backend whose
    kernels read host buffers later says until when (``host_reads_until``). The forward's
    read-done event releases them when it is not earlier than that and the host launches it
    between phases; otherwise (``NONE``) they are released by the forward's done event. The
    in-graph node is not used: its persistent external event is re-armed by every replay.
    """
    needed = SharedReadBoundary.PRE_REPLAY
    if host_reads_until is not None and host_reads_until > needed:
        needed = host_reads_until
    if point in _EAGER_POINTS and point.boundary >= needed and needed < SharedReadBoundary.UNKNOWN:
        return point
    return RecordPoint.NONE
