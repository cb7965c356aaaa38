"""The ``cuda`` device: thin wrappers over torch.cuda streams, events and CUDA graphs.

Every CUDA object is created inside a method: on a CPU-only torch build creating one raises, and
importing this module must stay free of device work. Misuse that the ``sim`` device rejects
(non-external records and waits inside a capture, syncs while capturing) is rejected here too,
so runner code that passes on ``sim`` behaves the same on a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from ._base import Device, DeviceError, Event, ForwardId, Graph, RecordRef, Stream

# torch's default "global" capture mode makes an unsafe CUDA call from ANY thread invalidate the
# capture; the overlap scheduler keeps running on its own thread, so only this thread's calls
# are checked.
_CAPTURE_ERROR_MODE = "thread_local"


class CudaEvent(Event):
    def __init__(self, device: CudaDevice, external: bool) -> None:
        self.external = external
        self._device = device
        # external=True: recorded while capturing, torch calls cudaEventRecordWithFlags with
        # cudaEventRecordExternal, which makes an event-record node that fires on every replay.
        self.raw = torch.cuda.Event(external=external)  # type: ignore[no-untyped-call]
        self._src: tuple[CudaStream, int] | None = None
        # Host-side binding, as on sim: CUDA binds a wait to the record issued last when the
        # wait is issued, so the generation and forward of that record are known on the host.
        # (Written like the sim device's; untested without a GPU.)
        self._gen = 0
        self._forward: ForwardId | None = None

    def _bind(self) -> None:
        self._gen += 1
        self._forward = self._device.current_forward()

    def last_record(self) -> RecordRef | None:
        return RecordRef(self._gen, self._forward) if self._gen else None

    def record(self, stream: Stream | None = None) -> None:
        target = self._device._cuda_stream(stream)
        graph = target._capture
        if graph is not None:
            if not self.external:
                raise DeviceError(
                    f"non-external event recorded on stream {target.name!r} while it is "
                    "capturing: it would only add a dependency inside the graph and never fire "
                    "for the host or other streams; create the event with external=True"
                )
            self.raw.record(target.raw)
            graph._record_nodes.append(self)
            graph._nodes += 1
            return
        self.raw.record(target.raw)
        self._src = (target, target._seq)
        self._bind()

    def synchronize(self) -> None:
        src = self._src
        try:
            self.raw.synchronize()
        except RuntimeError as exc:
            where = f"stream {src[0].name!r}" if src is not None else "an unknown stream"
            raise DeviceError(f"cuda event recorded on {where} failed: {exc}") from exc
        if src is not None:
            stream, seq = src
            stream._raise_if_failed(before_seq=seq)

    def query(self) -> bool:
        return bool(self.raw.query())  # type: ignore[no-untyped-call]


class CudaStream(Stream):
    def __init__(self, device: CudaDevice, name: str, raw: torch.cuda.Stream) -> None:
        super().__init__(device, name)
        self._cuda_device = device
        self.raw = raw
        self._seq = 0  # launches so far; numbers failures relative to event records
        self._capture: CudaGraph | None = None

    def _check_not_capturing(self, what: str) -> None:
        if self._capture is not None:
            raise DeviceError(
                f"{what} on stream {self.name!r} while it is capturing (not supported inside a "
                "warcore capture)"
            )

    def wait_event(self, event: Event) -> RecordRef | None:
        if not isinstance(event, CudaEvent):
            raise DeviceError(f"stream {self.name!r} cannot wait on {event!r}: not a cuda event")
        self._check_not_capturing("an event wait")
        # An event never recorded makes this a no-op (torch skips the wait).
        self.raw.wait_event(event.raw)
        return event.last_record()

    def synchronize(self) -> None:
        self._check_not_capturing("synchronize")
        try:
            self.raw.synchronize()
        except RuntimeError as exc:
            raise DeviceError(f"cuda stream {self.name!r} failed: {exc}") from exc
        self._raise_if_failed()


class CudaGraph(Graph):
    def __init__(self, device: CudaDevice) -> None:
        self._device = device
        self.raw = torch.cuda.CUDAGraph()
        self._captured = False
        self._capturing = False
        self._nodes = 0  # launches and record nodes captured; an empty graph is refused
        self._record_nodes: list[CudaEvent] = []

    def replay(self) -> None:
        device = self._device
        device._check_open()
        if not self._captured:
            raise DeviceError("replay of a cuda graph that was never captured")
        if self._nodes == 0:
            raise DeviceError("replay of an empty cuda graph: nothing was launched in its capture")
        stream = device._cuda_stream(None)
        stream._check_not_capturing("a graph replay")
        with torch.cuda.stream(stream.raw):
            self.raw.replay()
        for ev in self._record_nodes:
            ev._src = (stream, stream._seq)
            ev._bind()  # each replay's node re-arms the event: a new record, this forward's


class CudaDevice(Device):
    name = "cuda"

    def __init__(self) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise DeviceError(
                "cuda device requested but no CUDA GPU is usable "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                "use get_device('sim') on a machine without a GPU"
            )
        self.torch_device = torch.device("cuda", torch.cuda.current_device())
        self._streams_lock = threading.Lock()
        self._default = CudaStream(self, "default", torch.cuda.default_stream(self.torch_device))
        self._streams: list[CudaStream] = [self._default]
        self._side: CudaStream | None = None

    @property
    def default_stream(self) -> Stream:
        return self._default

    def _cuda_stream(self, stream: Stream | None) -> CudaStream:
        s = self.current_stream() if stream is None else stream
        if not isinstance(s, CudaStream) or s._cuda_device is not self:
            raise DeviceError(f"{s!r} is not a stream of this cuda device")
        return s

    def new_stream(self, name: str) -> Stream:
        self._check_open()
        raw = torch.cuda.Stream(device=self.torch_device)  # type: ignore[no-untyped-call]
        stream = CudaStream(self, name, raw)
        with self._streams_lock:
            self._streams.append(stream)
        return stream

    def new_event(self, *, external: bool = False) -> Event:
        return CudaEvent(self, external)

    def launch(self, fn: Callable[[], object], label: str = "") -> None:
        self._check_open()
        stream = self._cuda_stream(None)
        graph = stream._capture
        if graph is not None:
            graph._nodes += 1
            try:
                with torch.cuda.stream(stream.raw):
                    fn()
            except Exception as exc:
                raise DeviceError(
                    f"cuda stream {stream.name!r}: work {label or '<unlabelled>'!r} failed "
                    f"while capturing: {exc}"
                ) from exc
            return
        if stream._failure is not None:
            return  # sticky, as on sim: work after a failure never runs
        seq = stream._seq
        stream._seq += 1
        try:
            with torch.cuda.stream(stream.raw):
                fn()
        except Exception as exc:
            # Reported at the next synchronize, like a failure of asynchronous device work and
            # like the sim device, so runner code sees errors at the same place on both.
            stream._set_failure(seq, label, exc)

    def new_graph(self) -> Graph:
        return CudaGraph(self)

    def _side_stream(self) -> CudaStream:
        if self._side is None:
            self._side = self._new_cuda_stream("capture")
        return self._side

    def _new_cuda_stream(self, name: str) -> CudaStream:
        s = self.new_stream(name)
        assert isinstance(s, CudaStream)
        return s

    @contextmanager
    def _capture(self, graph: Graph) -> Iterator[None]:
        self._check_open()
        if not isinstance(graph, CudaGraph) or graph._device is not self:
            raise DeviceError(f"{graph!r} is not a graph of this cuda device")
        if graph._captured or graph._capturing:
            raise DeviceError("this cuda graph is already captured (make a new graph)")
        current = self._cuda_stream(None)
        if current._capture is not None:
            raise DeviceError(f"stream {current.name!r} is already capturing")
        # The legacy default stream cannot be captured: torch requires a side stream, ordered
        # after the work already on the current one and joined back afterwards.
        target = self._side_stream() if current is self._default else current
        if target is not current:
            target.wait_stream(current)
        graph._capturing = True
        target._capture = graph
        try:
            with (
                torch.cuda.graph(
                    graph.raw, stream=target.raw, capture_error_mode=_CAPTURE_ERROR_MODE
                ),
                self._use_stream(target),
            ):
                yield
            graph._captured = True
        finally:
            target._capture = None
            graph._capturing = False
        if target is not current:
            current.wait_stream(target)

    def capture(self, graph: Graph) -> AbstractContextManager[None]:
        return self._capture(graph)

    def is_capturing(self) -> bool:
        return self._cuda_stream(None)._capture is not None

    def synchronize(self) -> None:
        with self._streams_lock:
            streams = list(self._streams)
        for s in streams:
            s._check_not_capturing("device synchronize")
        try:
            torch.cuda.synchronize(self.torch_device)
        except RuntimeError as exc:
            raise DeviceError(f"cuda device failed: {exc}") from exc
        failed = [s for s in streams if s._failure is not None]
        if failed:
            first = min(failed, key=lambda s: s._failure.order if s._failure else 0)
            first._raise_if_failed()
