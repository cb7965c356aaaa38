"""The ``sim`` device: CUDA's stream, event and graph ordering rules on CPU worker threads.

Each stream is a worker thread running its work in FIFO order. torch CPU kernels release the
GIL, so work on two streams really runs at the same time, and a missing or misplaced fence
really races, as on a GPU. Events follow CUDA's binding rules: a record binds a new generation
when the host calls it, a wait binds to the latest generation recorded when the host calls it.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import torch

from ._base import Device, DeviceError, Event, ForwardId, Graph, RecordRef, Stream

_log = logging.getLogger(__name__)

# Seconds close() waits for each worker to drain its queue before leaving it behind (the
# workers are daemon threads, so one stuck in user work cannot keep the process alive).
_CLOSE_JOIN_TIMEOUT_S = 10.0


class _Work:
    __slots__ = ("fn", "label")

    def __init__(self, fn: Callable[[], object], label: str) -> None:
        self.fn = fn
        self.label = label


class _Record:
    __slots__ = ("event", "gen")

    def __init__(self, event: SimEvent) -> None:
        self.event = event
        self.gen = 0  # bound when submitted, under the stream's lock


class _Wait:
    __slots__ = ("event", "gen")

    def __init__(self, event: SimEvent, gen: int) -> None:
        self.event = event
        self.gen = gen


class _Fence:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_Item = _Work | _Record | _Wait | _Fence


class SimEvent(Event):
    def __init__(self, device: SimDevice, external: bool) -> None:
        self.external = external
        self._device = device
        self._cond = threading.Condition(threading.Lock())
        self._gen = 0  # latest generation bound by a host-side record
        # Generations bound but not yet reached by their stream. Records may sit on different
        # streams, so generations can complete out of order; a set (rather than a "completed up
        # to" counter) keeps that exact, and stays small because completed ones are removed.
        self._pending: set[int] = set()
        # Stream and submission number of the latest record, to tell whether that stream had
        # already failed when the record was reached (Event.synchronize raises only then).
        self._src: tuple[SimStream, int] | None = None
        self._forward: ForwardId | None = None  # the forward of the latest record

    def __repr__(self) -> str:
        return f"<SimEvent gen={self._gen} external={self.external}>"

    # -- called by streams ------------------------------------------------------------------

    def _bind_record(self, stream: SimStream, seq: int, forward: ForwardId | None) -> int:
        with self._cond:
            self._gen += 1
            self._pending.add(self._gen)
            self._src = (stream, seq)
            self._forward = forward
            return self._gen

    def last_record(self) -> RecordRef | None:
        with self._cond:
            return RecordRef(self._gen, self._forward) if self._gen else None

    def _complete(self, gen: int) -> None:
        with self._cond:
            self._pending.discard(gen)
            self._cond.notify_all()

    def _wait_for(self, gen: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: gen not in self._pending)

    # -- public -----------------------------------------------------------------------------

    def record(self, stream: Stream | None = None) -> None:
        target = self._device._sim_stream(stream)
        graph = target._capture
        if graph is None:
            target._submit((_Record(self),))
        elif self.external:
            graph._add(self)
        else:
            raise DeviceError(
                f"non-external event recorded on stream {target.name!r} while it is capturing: "
                "on CUDA that only adds a dependency inside the graph and never fires for the "
                "host or other streams; create the event with external=True for a record node"
            )

    def synchronize(self) -> None:
        with self._cond:
            gen = self._gen
            src = self._src
            self._cond.wait_for(lambda: gen not in self._pending)
        if src is not None:
            stream, seq = src
            stream._raise_if_failed(before_seq=seq)

    def query(self) -> bool:
        with self._cond:
            return self._gen not in self._pending


# A captured graph node: work (shared by all replays, it is immutable) or an external event
# whose record node binds a fresh generation on every replay.
_Node = _Work | SimEvent


class SimStream(Stream):
    def __init__(self, device: SimDevice, name: str) -> None:
        super().__init__(device, name)
        self._sim_device = device
        self._queue: queue.SimpleQueue[tuple[int, _Item] | None] = queue.SimpleQueue()
        # Guards submission numbering, lazy worker start and stop, and makes a multi-item
        # submission (a graph replay) contiguous in the queue.
        self._lock = threading.Lock()
        self._next_seq = 0
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._capture: SimGraph | None = None

    def _submit(self, items: Sequence[_Item]) -> None:
        with self._lock:
            if self._stopped:
                raise DeviceError(f"sim stream {self.name!r}: the device is closed")
            if self._thread is None:
                # Started on first use, so that building a device or stream costs no thread.
                self._thread = threading.Thread(
                    target=self._run, name=f"warcore-sim-{self.name}", daemon=True
                )
                self._thread.start()
            for item in items:
                seq = self._next_seq
                self._next_seq += 1
                if isinstance(item, _Record):
                    # The forward current on the submitting host thread: the one this record
                    # (a plain record, or a replayed graph's node) belongs to.
                    forward = self._sim_device.current_forward()
                    item.gen = item.event._bind_record(self, seq, forward)
                self._queue.put((seq, item))

    def _run(self) -> None:
        # The intra-op thread count is per thread (OpenMP's ICV): set it in the worker too,
        # or every op here fans out to all cores and two busy streams spin against each other.
        torch.set_num_threads(1)
        get = self._queue.get
        device = self._sim_device
        while True:
            entry = get()
            if entry is None:
                return
            seq, item = entry
            if isinstance(item, _Work):
                if self._failure is not None:
                    continue  # sticky: work after a failure never runs
                sink = device._span_sink
                try:
                    if sink is None:
                        item.fn()
                    else:
                        t0 = time.perf_counter()
                        item.fn()
                        sink(self.name, item.label, t0, time.perf_counter())
                except BaseException as exc:  # the worker must survive anything; waiters need it
                    self._set_failure(seq, item.label, exc)
            elif isinstance(item, _Record):
                # Completes even on a failed stream, so that no waiter ever hangs.
                item.event._complete(item.gen)
            elif isinstance(item, _Wait):
                item.event._wait_for(item.gen)
            else:
                item.done.set()

    def _fence(self) -> None:
        """Block the host until everything submitted so far has been processed."""
        with self._lock:
            idle = self._thread is None or self._stopped
        if idle:
            return  # never used, or drained and joined by close()
        fence = _Fence()
        self._submit((fence,))
        fence.done.wait()

    def _stop(self) -> threading.Thread | None:
        with self._lock:
            if self._stopped:
                return None
            self._stopped = True
            if self._thread is not None:
                self._queue.put(None)
            return self._thread

    def _check_not_capturing(self, what: str) -> None:
        if self._capture is not None:
            raise DeviceError(
                f"{what} on stream {self.name!r} while it is capturing: captured work has not "
                "run; a CUDA capture would be invalidated by this"
            )

    def wait_event(self, event: Event) -> RecordRef | None:
        if not isinstance(event, SimEvent):
            raise DeviceError(f"stream {self.name!r} cannot wait on {event!r}: not a sim event")
        self._check_not_capturing("an event wait")
        bound = event.last_record()
        if bound is None:
            return None  # never recorded: a no-op, as cudaStreamWaitEvent on an unrecorded event
        self._submit((_Wait(event, bound.generation),))
        return bound

    def synchronize(self) -> None:
        self._check_not_capturing("synchronize")
        self._fence()
        self._raise_if_failed()


class SimGraph(Graph):
    def __init__(self, device: SimDevice) -> None:
        self._device = device
        self._nodes: list[_Node] | None = None  # None until a capture completed
        self._building: list[_Node] | None = None

    def _add(self, node: _Node) -> None:
        assert self._building is not None
        self._building.append(node)

    def replay(self) -> None:
        device = self._device
        device._check_open()
        nodes = self._nodes
        if nodes is None:
            raise DeviceError("replay of a sim graph that was never captured")
        if not nodes:
            raise DeviceError("replay of an empty sim graph: nothing was launched in its capture")
        stream = device._sim_stream(None)
        stream._check_not_capturing("a graph replay")
        # One submission, so that each record node binds its generation now, at the host call,
        # and a wait issued right after replay() binds to this replay's node.
        stream._submit([n if isinstance(n, _Work) else _Record(n) for n in nodes])


_LIVE: weakref.WeakSet[SimDevice] = weakref.WeakSet()


@atexit.register
def _close_live_devices() -> None:
    # A worker still inside a torch kernel while the interpreter tears down aborts the process
    # ("terminate called without an active exception"); drain and stop them first.
    for device in list(_LIVE):
        device.close()


class SimDevice(Device):
    name = "sim"

    def __init__(self) -> None:
        super().__init__()
        _LIVE.add(self)
        # Each stream is one worker thread; the development machine has 2 cores, and torch's
        # intra-op pool is shared by all threads, so with its default several threads per op
        # two streams would fight over the same cores and overlap would vanish. One intra-op
        # thread per worker keeps each stream one CPU "engine". This is process-wide.
        torch.set_num_threads(1)
        self.torch_device = torch.device("cpu")
        self._streams_lock = threading.Lock()
        self._default = SimStream(self, "default")
        self._streams: list[SimStream] = [self._default]

    @property
    def default_stream(self) -> Stream:
        return self._default

    def _sim_stream(self, stream: Stream | None) -> SimStream:
        s = self.current_stream() if stream is None else stream
        if not isinstance(s, SimStream) or s._sim_device is not self:
            raise DeviceError(f"{s!r} is not a stream of this sim device")
        return s

    def new_stream(self, name: str) -> Stream:
        self._check_open()
        stream = SimStream(self, name)
        with self._streams_lock:
            self._streams.append(stream)
        return stream

    def new_event(self, *, external: bool = False) -> Event:
        return SimEvent(self, external)

    def launch(self, fn: Callable[[], object], label: str = "") -> None:
        self._check_open()
        stream = self._sim_stream(None)
        graph = stream._capture
        if graph is not None:
            graph._add(_Work(fn, label))
        else:
            stream._submit((_Work(fn, label),))

    def new_graph(self) -> Graph:
        return SimGraph(self)

    @contextmanager
    def _capture(self, graph: Graph) -> Iterator[None]:
        self._check_open()
        if not isinstance(graph, SimGraph) or graph._device is not self:
            raise DeviceError(f"{graph!r} is not a graph of this sim device")
        if graph._nodes is not None or graph._building is not None:
            raise DeviceError("this sim graph is already captured (make a new graph)")
        stream = self._sim_stream(None)
        if stream._capture is not None:
            raise DeviceError(f"stream {stream.name!r} is already capturing")
        nodes: list[_Node] = []
        graph._building = nodes
        stream._capture = graph
        try:
            yield
        finally:
            stream._capture = None
            graph._building = None
        # Only a capture whose body finished makes the graph replayable.
        graph._nodes = nodes

    def capture(self, graph: Graph) -> AbstractContextManager[None]:
        return self._capture(graph)

    def is_capturing(self) -> bool:
        return self._sim_stream(None)._capture is not None

    def _all_streams(self) -> list[SimStream]:
        with self._streams_lock:
            return list(self._streams)

    def synchronize(self) -> None:
        streams = self._all_streams()
        for s in streams:
            s._check_not_capturing("device synchronize")
        # Fence every stream first and wait afterwards, so the host waits for the slowest stream
        # once rather than for each in turn.
        fences: list[_Fence] = []
        for s in streams:
            with s._lock:
                active = s._thread is not None and not s._stopped
            if active:
                fence = _Fence()
                s._submit((fence,))
                fences.append(fence)
        for fence in fences:
            fence.done.wait()
        failed = [s for s in streams if s._failure is not None]
        if failed:
            first = min(failed, key=lambda s: s._failure.order if s._failure else 0)
            first._raise_if_failed()

    def close(self) -> None:
        if self._closed:
            return
        super().close()
        threads = [t for t in (s._stop() for s in self._all_streams()) if t is not None]
        deadline = time.monotonic() + _CLOSE_JOIN_TIMEOUT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                _log.warning("sim stream worker %s did not stop within its timeout", t.name)
