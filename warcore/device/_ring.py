"""A ring of read-done events per publisher (sglang #31698's ``ReusableEventRing``).

A record re-arms an event when the host issues it, so a wait issued after the next record of
the same event binds to that next record, not to the one it meant (sglang #31072). A publisher
that draws each record from a ring of ``depth`` events re-uses an event only ``depth`` records
later: a consumer that waits up to ``depth - 1`` records after the one it meant still binds to
it. The depth is what the publisher's loop can have in flight (:func:`records_in_flight`); a
shallower ring is refused when it is built.
"""

from __future__ import annotations

from ._base import Device, Event, Stream

__all__ = ["EventRing", "RingTooShallow", "check_ring_depth", "records_in_flight"]


class RingTooShallow(ValueError):
    """An event ring shallower than the records its publisher can have in flight."""


def records_in_flight(records_per_step: int, consumer_lag_steps: int) -> int:
    """The ring depth a publisher needs: the record a consumer means, plus every record the
    publisher can issue before the consumer's wait (``records_per_step`` for each step the
    slowest consumer waits after the step it means)."""
    if records_per_step < 1 or consumer_lag_steps < 0:
        raise ValueError(
            f"records_per_step must be >= 1 and consumer_lag_steps >= 0, got "
            f"{records_per_step} and {consumer_lag_steps}"
        )
    return 1 + records_per_step * consumer_lag_steps


def check_ring_depth(depth: int, needed: int, publisher: str, what: str = "event ring") -> None:
    """Refuse a ring of ``depth`` slots where ``needed`` records can be in flight, naming the
    publisher (an event ring, or a graph runner's ring of captured record nodes)."""
    if depth < needed:
        raise RingTooShallow(
            f"{publisher}: {what} depth {depth} is too shallow; it needs at least "
            f"{needed} (the read-done records it can have in flight)"
        )


class EventRing:
    """``depth`` events, handed out in turn; :meth:`record` is the one way a publisher makes a
    read-done record (a scan test holds every publisher in the package to that)."""

    __slots__ = ("_events", "_next", "depth", "publisher")

    def __init__(self, device: Device, depth: int, publisher: str, *, needed: int = 1) -> None:
        check_ring_depth(depth, needed, publisher)
        self.depth = depth
        self.publisher = publisher
        self._events = [device.new_event() for _ in range(depth)]
        self._next = 0

    def record(self, stream: Stream) -> Event:
        """Record the ring's next event on ``stream`` and return it."""
        i = self._next
        self._next = (i + 1) % self.depth
        event = self._events[i]
        event.record(stream)
        return event
