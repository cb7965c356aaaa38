"""The device-neutral part of the device layer: the abstract API and its shared bookkeeping.

Runners and the engine are written against these classes only, so the same code drives the
``sim`` device (worker threads on the CPU) and the ``cuda`` device (torch.cuda streams).
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple, TypeVar

if TYPE_CHECKING:
    import torch

DEVICE_NAMES: tuple[str, ...] = ("sim", "cuda")

SpanSink = Callable[[str, str, float, float], None]
"""``sink(stream_name, label, t_start, t_end)``, times from :func:`time.perf_counter`."""

# Failures are ordered across all streams of all devices so that Device.synchronize can report
# the one that happened first, like CUDA reports the first sticky error of a context.
_failure_order = itertools.count()


_D = TypeVar("_D", bound="Device")


class DeviceError(RuntimeError):
    """A sticky device error, or misuse of the device API.

    Messages name the stream and, for failed work, the label of the work that failed; a failure
    raised at a synchronize is chained (``__cause__``) to the original exception.
    """


@dataclass(frozen=True)
class _Failure:
    seq: int  # submission number of the failing work on its stream
    order: int  # global order, to pick the first failure of a device
    label: str
    exc: BaseException


class ForwardId(NamedTuple):
    """The forward a record belongs to: ``seq`` orders forwards on their device (one count per
    device, in launch order); ``step`` and ``runner`` say which step's which runner it was."""

    seq: int
    step: int
    runner: str
    mode: str

    def describe(self) -> str:
        return f"step {self.step} {self.runner} {self.mode} (forward #{self.seq})"


class RecordRef(NamedTuple):
    """One record of an event: its generation (1, 2, ... per event, bound when the host issued
    the record) and the forward that was current on the host thread then (``None``: none)."""

    generation: int
    forward: ForwardId | None


class WaitBinding(NamedTuple):
    """One wait on a read-done event: who waited (``barrier``, ``copy``, ...), the forward it
    meant (the one that published the event) and the record it bound to."""

    consumer: str
    meant: ForwardId | None
    bound: RecordRef | None

    @property
    def verdict(self) -> str:
        """``bound`` (to the forward it meant), ``earlier`` (to an earlier forward's record:
        it may not wait for the reads it fences, unsafe), ``later`` (to a later forward's:
        it waits for more than it means, the shape that deadlocked sglang #31072), or
        ``unknown`` (no forward on one side: nothing to compare)."""
        bound = self.bound.forward if self.bound is not None else None
        if self.meant is None or bound is None:
            return "unknown"
        if bound.seq == self.meant.seq:
            return "bound"
        return "earlier" if bound.seq < self.meant.seq else "later"


class Event(ABC):
    """A marker recorded into a stream's work; waits and host syncs bind to a recorded point.

    Every record is bound on the host, when it is issued (a graph's record node: when the graph
    is replayed), and carries the forward current on that host thread
    (:meth:`Device.set_forward`); :meth:`last_record` says which record a wait issued now
    would bind to, and :meth:`Stream.wait_event` returns the one it bound to.
    """

    external: bool

    @abstractmethod
    def last_record(self) -> RecordRef | None:
        """The record bound last on the host (``None``: never recorded)."""

    @abstractmethod
    def record(self, stream: Stream | None = None) -> None:
        """Record on ``stream`` (``None``: the device's current stream of this host thread)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Host waits for the point recorded last; returns at once if never recorded."""

    @abstractmethod
    def query(self) -> bool:
        """Whether the point recorded last has been reached (True if never recorded)."""


class Stream(ABC):
    """An in-order queue of device work."""

    name: str

    def __init__(self, device: Device, name: str) -> None:
        self.name = name
        self._device = device
        self._failure_lock = threading.Lock()
        self._failure: _Failure | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self._device.name}>"

    @abstractmethod
    def wait_event(self, event: Event) -> RecordRef | None:
        """Later work on this stream waits for ``event``'s latest recorded point (GPU side);
        returns the record the wait bound to (``None``: never recorded, the wait is a no-op)."""

    def wait_stream(self, other: Stream) -> None:
        """Later work on this stream waits for all work enqueued on ``other`` so far."""
        self.wait_event(other.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        ev = event if event is not None else self._device.new_event()
        ev.record(self)
        return ev

    @abstractmethod
    def synchronize(self) -> None:
        """Host waits for this stream; raises :class:`DeviceError` if it is sticky-failed."""

    # -- sticky failure bookkeeping, shared by both implementations --------------------------

    def _set_failure(self, seq: int, label: str, exc: BaseException) -> None:
        with self._failure_lock:
            if self._failure is None:  # sticky: the first error is the one that is reported
                self._failure = _Failure(seq, next(_failure_order), label, exc)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def _raise_if_failed(self, before_seq: int | None = None) -> None:
        """Raise the sticky failure, if any; with ``before_seq`` only one submitted earlier."""
        failure = self._failure
        if failure is None or (before_seq is not None and failure.seq >= before_seq):
            return
        label = failure.label or "<unlabelled>"
        raise DeviceError(
            f"{self._device.name} stream {self.name!r} failed in work {label!r}: "
            f"{type(failure.exc).__name__}: {failure.exc}"
        ) from failure.exc


class Graph(ABC):
    """Work captured once and enqueued again on every :meth:`replay`."""

    @abstractmethod
    def replay(self) -> None:
        """Enqueue the captured work on the current stream of this host thread."""


class Device(ABC):
    """A device: streams, events, graphs, and the one way device work is launched."""

    name: str
    torch_device: torch.device

    def __init__(self) -> None:
        self._tls = threading.local()
        self._span_sink: SpanSink | None = None
        self._closed = False
        self._forward_seq = itertools.count(1)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- streams ----------------------------------------------------------------------------

    @abstractmethod
    def new_stream(self, name: str) -> Stream: ...

    @property
    @abstractmethod
    def default_stream(self) -> Stream: ...

    def current_stream(self) -> Stream:
        stream: Stream | None = getattr(self._tls, "stream", None)
        return stream if stream is not None else self.default_stream

    @contextmanager
    def _use_stream(self, stream: Stream) -> Iterator[None]:
        if stream._device is not self:
            raise DeviceError(f"stream {stream.name!r} belongs to another device")
        previous: Stream | None = getattr(self._tls, "stream", None)
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = previous

    def use_stream(self, stream: Stream) -> AbstractContextManager[None]:
        """Make ``stream`` the current stream of this host thread for the ``with`` block."""
        return self._use_stream(stream)

    # -- the forward that records ----------------------------------------------------------

    def begin_forward(self, step: int, runner: str, mode: str) -> ForwardId:
        """A forward starts on this host thread: every record issued here until the next one
        carries the returned id (numbered in launch order on this device)."""
        forward = ForwardId(next(self._forward_seq), step, runner, mode)
        self._tls.forward = forward
        return forward

    def current_forward(self) -> ForwardId | None:
        """The forward the records this host thread issues now belong to."""
        forward: ForwardId | None = getattr(self._tls, "forward", None)
        return forward

    # -- events, work, graphs ---------------------------------------------------------------

    @abstractmethod
    def new_event(self, *, external: bool = False) -> Event: ...

    @abstractmethod
    def launch(self, fn: Callable[[], object], label: str = "") -> None:
        """Launch ``fn`` as device work on the current stream (recorded, if capturing)."""

    @abstractmethod
    def new_graph(self) -> Graph: ...

    @abstractmethod
    def capture(self, graph: Graph) -> AbstractContextManager[None]:
        """Capture the work launched on the current stream in the block into ``graph``."""

    @abstractmethod
    def is_capturing(self) -> bool:
        """Whether this host thread's current stream is being captured."""

    @abstractmethod
    def synchronize(self) -> None:
        """Host waits for every stream; raises :class:`DeviceError` for a sticky-failed one."""

    # -- tracing ----------------------------------------------------------------------------

    def set_span_sink(self, sink: SpanSink | None) -> None:
        """Report each launched work item's span to ``sink`` (sim only; cuda ignores it)."""
        self._span_sink = sink

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release the device's host resources; idempotent."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError(f"{self.name} device is closed")

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
