"""Where each runner records its read-done event: small pure functions, no plugin calls.

The rules behind all of them: a record point is never earlier than the declared boundary, and
a runner publishes only for a forward that its algorithm calls its publish phase (a ``False`` or
a failed answer publishes nothing, in every mode). A captured graph with no planted node records
after the replay, as sglang 0.5.23 does (#34052 recorded ``IN_REPLAY`` before the replay there).
An eager forward's declared boundary is its eager path's (resolution gives ``POST_REPLAY`` when
only the graph is declared), so the eager point right after the in-graph init is used only when
the eager path was declared ``IN_REPLAY`` on its own.
"""

from __future__ import annotations

from ._boundary import Execution, RecordPoint, SharedReadBoundary
from ._modes import ForwardMode

__all__ = [
    "decode_record_point",
    "draft_extend_record_point",
    "honour_boundary",
    "prefill_record_point",
]


def honour_boundary(declared: SharedReadBoundary, execution: Execution) -> RecordPoint:
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


def decode_record_point(
    forward_mode: ForwardMode,
    declared: SharedReadBoundary,
    publish_phase: bool,
    execution: Execution,
) -> RecordPoint:
    """Decode / target-verify runner: the algorithm's gate precedes the declaration."""
    if not publish_phase or forward_mode not in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
        return RecordPoint.NONE
    return honour_boundary(declared, execution)


def draft_extend_record_point(
    forward_mode: ForwardMode,
    declared: SharedReadBoundary,
    publish_phase: bool,
    execution: Execution,
) -> RecordPoint:
    """EAGLE draft-extend runner: publishes per the backend's ``DRAFT_EXTEND_V2`` declaration."""
    if forward_mode is not ForwardMode.DRAFT_EXTEND_V2 or not publish_phase:
        return RecordPoint.NONE
    return honour_boundary(declared, execution)


def prefill_record_point(
    forward_mode: ForwardMode, declared: SharedReadBoundary, publish_phase: bool
) -> RecordPoint:
    """Prefill runner: only exactly ``EXTEND``, a publishing algorithm, a PRE_REPLAY backend."""
    if (
        forward_mode is ForwardMode.EXTEND
        and publish_phase
        and declared is SharedReadBoundary.PRE_REPLAY
    ):
        return RecordPoint.PRE_REPLAY
    return RecordPoint.NONE
