"""Shared-read boundaries (what a backend declares) and record points (what a runner does)."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Declared", "Execution", "RecordPoint", "SharedReadBoundary", "latest"]


class SharedReadBoundary(enum.Enum):
    """Where a forward's last read of scheduler-shared buffers ends, earliest first.

    Ordered: ``PRE_REPLAY < IN_REPLAY < POST_REPLAY < UNKNOWN``. Combining declarations takes
    the latest (:func:`latest`), so ``UNKNOWN`` (not audited: publish nothing) dominates.
    """

    PRE_REPLAY = 0
    IN_REPLAY = 1
    POST_REPLAY = 2
    UNKNOWN = 3

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SharedReadBoundary):
            return NotImplemented
        return self.value < other.value

    def __le__(self, other: object) -> bool:
        if not isinstance(other, SharedReadBoundary):
            return NotImplemented
        return self.value <= other.value

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, SharedReadBoundary):
            return NotImplemented
        return self.value > other.value

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, SharedReadBoundary):
            return NotImplemented
        return self.value >= other.value

    @classmethod
    def parse(cls, value: str | SharedReadBoundary) -> SharedReadBoundary:
        if isinstance(value, SharedReadBoundary):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            valid = ", ".join(b.name for b in cls)
            raise ValueError(f"unknown shared-read boundary {value!r}; valid: {valid}") from None


def latest(*boundaries: SharedReadBoundary | Iterable[SharedReadBoundary]) -> SharedReadBoundary:
    """The latest of the given boundaries; ``UNKNOWN`` dominates; nothing given → ``UNKNOWN``.

    Accepts boundaries or iterables of them: ``latest(a, b)`` and ``latest([a, b])`` agree.
    """
    flat: list[SharedReadBoundary] = []
    for item in boundaries:
        if isinstance(item, SharedReadBoundary):
            flat.append(item)
        elif isinstance(item, str | bytes):
            # A string is iterable too: without this, latest("PRE_REPLAY") blamed 'P'.
            raise TypeError(
                f"latest() takes SharedReadBoundary values, got the string {item!r}; "
                "use SharedReadBoundary.parse() for names"
            )
        else:
            flat.extend(item)
    for b in flat:
        if not isinstance(b, SharedReadBoundary):
            raise TypeError(f"latest() takes SharedReadBoundary values, got {b!r}")
    return max(flat, default=SharedReadBoundary.UNKNOWN, key=lambda b: b.value)


@dataclass(frozen=True)
class Declared:
    """A declaration scoped to the implementation it was audited against.

    ``implementation`` is a requirement: a distribution name and a PEP 440 specifier, such as
    ``"sglang>=0.5.23,<0.6"`` or ``"warcore-trtllm-mha>=0.1,<0.2"``. A hook may return this
    instead of a bare :class:`SharedReadBoundary`; when the named distribution is not installed,
    or its version is outside the range, the declaration is *stale*: it is not applied (the
    cell takes the coarse fence, provenance ``stale:<plugin>``) and ``warcore check`` reports it.
    """

    boundary: SharedReadBoundary
    implementation: str

    def __post_init__(self) -> None:
        if not isinstance(self.boundary, SharedReadBoundary):
            raise TypeError(
                f"Declared.boundary must be a SharedReadBoundary, got {self.boundary!r}"
            )
        from ._scope import parse_requirement

        parse_requirement(self.implementation)  # a malformed range fails where it is written


class Execution(enum.Enum):
    """How a runner executes the forward whose record point is being decided."""

    EAGER = "eager"
    """Not captured: the runner can record right after the in-graph init when the eager path
    is declared on its own; otherwise after the whole forward."""
    GRAPH_PLANTED = "graph_planted"
    """Captured graph with an event-record node planted after the in-graph init."""
    GRAPH_UNPLANTED = "graph_unplanted"
    """Captured graph without a node: nothing can be recorded inside the replay."""

    # Identity hash (members are singletons): Enum's own __hash__ is a Python-level call, and
    # members key the per-replay decision lookup, where it cost ~0.1 µs per member.
    __hash__ = object.__hash__


class RecordPoint(enum.Enum):
    """Where a runner records the read-done event of one forward, earliest first."""

    NONE = "none"
    """Publish nothing: the scheduler keeps the coarse fence."""
    PRE_REPLAY = "pre_replay"
    """After ``load_batch`` (the out-graph init), before the replay."""
    IN_GRAPH_NODE = "in_graph_node"
    """The event-record node planted in the graph right after the in-graph init."""
    AFTER_IN_GRAPH_INIT = "after_in_graph_init"
    """Eager run: recorded on the stream right after the in-graph init."""
    POST_REPLAY = "post_replay"
    """After the whole replay is enqueued."""

    @property
    def publishes(self) -> bool:
        return self is not RecordPoint.NONE

    @property
    def boundary(self) -> SharedReadBoundary:
        """The boundary this record point is sound for."""
        return _POINT_BOUNDARY[self]


_POINT_BOUNDARY = {
    RecordPoint.NONE: SharedReadBoundary.UNKNOWN,
    RecordPoint.PRE_REPLAY: SharedReadBoundary.PRE_REPLAY,
    RecordPoint.IN_GRAPH_NODE: SharedReadBoundary.IN_REPLAY,
    RecordPoint.AFTER_IN_GRAPH_INIT: SharedReadBoundary.IN_REPLAY,
    RecordPoint.POST_REPLAY: SharedReadBoundary.POST_REPLAY,
}
