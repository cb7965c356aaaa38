"""A device whose stream and events record what the host enqueued, for vLLM's real classes on
a CPU, and the host-buffer sanitizer that runs on it.

On a CPU, vLLM's ``torch.cuda.Event`` / ``Stream`` are dummies (its own CPU platform swaps them
for no-ops) and a ``non_blocking`` host-to-device copy runs when it is called, so no overlap
hazard can show. Here instead:

* every host-to-device read of a persistent host buffer is *pending* from the moment the host
  enqueues it until the host learns that the device is past it: a ``copy_(..., non_blocking=True)``
  whose source lies in a registered host buffer (vLLM V1's pinned ``CpuGpuBuffer.cpu`` and
  ``InputBatch`` tensors), or a UVA view the device reads in place (V2's ``UvaBufferPool``
  slots, :meth:`RecordingDevice.read_in_place`);
* one stream orders everything: :class:`RecordingEvent` ``record()`` marks the stream's
  position; ``synchronize()`` tells the host that everything enqueued before that record is
  done; a device synchronize (``torch.cuda.synchronize``, ``torch.accelerator.synchronize``)
  that everything enqueued so far is;
* a pending read whose source bytes differ, when its completion becomes known, from what they
  were when it was enqueued is a **violation**: some legal schedule of a real device (one that
  runs the copy at any moment between the enqueue and the completion) reads other bytes. That
  is the worst case of every schedule, without picking one, and deterministic;
* at each declared *release point* (where the staging's guard lets the host rewrite its
  buffers) every registered host buffer is **poisoned**, every read still pending is checked
  against it, and the buffers are restored: anything the device would read after the release
  changes (the host-buffer sanitizer of :mod:`warcore.audit.host_buffers`, on vLLM's objects).

The copy runs when the host calls it (the host code goes on with the data it expects); only its
reads are audited. Nothing of vLLM is replaced but ``torch.cuda.Event`` / ``Stream`` (and the
synchronize functions), which on a CPU have no working implementation at all.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["PendingRead", "RecordingDevice", "RecordingEvent", "RecordingStream", "Violation"]


@dataclass
class PendingRead:
    """One device read of host memory not yet known to be done."""

    buffer: str
    source: torch.Tensor
    snapshot: torch.Tensor
    position: int
    step: int
    what: str


@dataclass(frozen=True)
class Violation:
    buffer: str
    step: int
    what: str
    when: str
    """Where it was found: ``release point of step N`` or ``completion``, and which."""

    def describe(self) -> str:
        return (
            f"{self.what} of step {self.step} reads {self.buffer}, which the host rewrote "
            f"before the device was known to be past that read ({self.when})"
        )


class RecordingEvent:
    """``torch.cuda.Event`` on the recording device: ``record`` binds to the stream position,
    ``synchronize`` completes the reads enqueued before it."""

    device: RecordingDevice  # bound by RecordingDevice.installed (a class per device)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.position: int | None = None
        self.records = 0

    def record(self, stream: Any = None) -> None:
        self.position = self.device.position
        self.records += 1

    def synchronize(self) -> None:
        if self.position is not None:
            self.device.complete(self.position, f"event synchronize (record {self.records})")
        self.device.released()

    def query(self) -> bool:
        return self.position is None or self.position <= self.device.completed

    def wait(self, stream: Any = None) -> None:  # a device-side wait orders nothing on the host
        pass


class RecordingStream:
    """``torch.cuda.Stream``: one stream for everything (vLLM V1 stages and runs the forward
    on the current stream; its side streams only copy outputs)."""

    device: RecordingDevice  # bound by RecordingDevice.installed (a class per device)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        self.device.synchronize("stream synchronize")

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        event = event if event is not None else self.device.event_class()
        event.record(self)
        return event

    def __enter__(self) -> RecordingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@dataclass
class RecordingDevice:
    """The stream, the pending reads and the registered host buffers (see the module
    docstring). Use :meth:`installed` around everything that builds or runs vLLM's objects."""

    host: dict[int, tuple[str, torch.Tensor]] = field(default_factory=dict)
    """Registered host buffers: untyped storage address -> (name, the whole tensor)."""
    pending: list[PendingRead] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    position: int = 0
    completed: int = 0
    step: int = 0
    reads: int = 0
    poisoned_releases: int = 0
    syncs: int = 0
    """Device synchronizes vLLM's code called (``torch.cuda`` / ``torch.accelerator``)."""
    sanitize: bool = True
    """Poison the host buffers at each release point (an event or device synchronize)."""

    # -- registration -----------------------------------------------------------------------
    def register(self, name: str, tensor: torch.Tensor) -> None:
        key = tensor.untyped_storage().data_ptr()
        if key and key not in self.host:
            self.host[key] = (name, tensor)

    def host_name(self, tensor: torch.Tensor) -> str | None:
        if tensor.device.type != "cpu":
            return None
        found = self.host.get(tensor.untyped_storage().data_ptr())
        return None if found is None else found[0]

    # -- the stream -------------------------------------------------------------------------
    def read_later(self, buffer: str, source: torch.Tensor, what: str) -> None:
        """The device reads ``source`` (host memory) some time before its completion."""
        self.position += 1
        self.reads += 1
        self.pending.append(
            PendingRead(buffer, source, source.detach().clone(), self.position, self.step, what)
        )

    def read_in_place(self, buffer: str, view: torch.Tensor, what: str) -> None:
        """A kernel reads the host memory ``view`` in place (UVA) until its step is done."""
        self.read_later(buffer, view, what)

    def rewritten(self, view: torch.Tensor, by: str) -> None:
        """The host just wrote ``view``'s memory: every read of it still pending is a
        violation, whatever bytes were written (a write-after-read)."""
        key = view.untyped_storage().data_ptr()
        for read in self.pending:
            if read.source.untyped_storage().data_ptr() == key:
                self.violations.append(Violation(read.buffer, read.step, read.what, f"{by}"))
        self.pending = [p for p in self.pending if p.source.untyped_storage().data_ptr() != key]

    def mark(self) -> int:
        """A point in the stream (the end of a step's forward); returns it."""
        self.position += 1
        return self.position

    def complete(self, upto: int, when: str) -> None:
        keep: list[PendingRead] = []
        for read in self.pending:
            if read.position > upto:
                keep.append(read)
                continue
            self._check(read, when)
        self.pending = keep
        self.completed = max(self.completed, upto)

    def synchronize(self, when: str = "device synchronize") -> None:
        self.complete(self.position, when)
        self.released()

    def _check(self, read: PendingRead, when: str) -> None:
        now = read.source
        if now.shape != read.snapshot.shape or not torch.equal(now, read.snapshot):
            self.violations.append(Violation(read.buffer, read.step, read.what, when))

    # -- the release point: poison, check, restore ------------------------------------------
    def released(self) -> None:
        if not self.sanitize:
            return
        self.poisoned_releases += 1
        saved = [(t, t.detach().clone()) for _, t in self.host.values()]
        with torch.no_grad():
            for tensor, _ in saved:
                _poison(tensor)
        when = f"host buffers poisoned at a release point in step {self.step}"
        for read in self.pending:
            self._check(read, when)
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)

    @functools.cached_property
    def event_class(self) -> type[RecordingEvent]:
        return type("RecordingCudaEvent", (RecordingEvent,), {"device": self})

    # -- installing the stand-ins -----------------------------------------------------------
    @contextlib.contextmanager
    def installed(self) -> Iterator[RecordingDevice]:
        """``torch.cuda.Event`` / ``Stream`` / ``synchronize`` and ``torch.Event`` /
        ``torch.accelerator.synchronize`` answer from this device, and host-to-device copies
        are recorded, inside the block; everything is put back after it."""
        device = self
        event = self.event_class
        stream = type("RecordingCudaStream", (RecordingStream,), {"device": self})

        def sync(*args: Any, **kwargs: Any) -> None:
            device.syncs += 1
            device.synchronize("device synchronize")

        current = stream()
        patches = [
            (torch.cuda, "Event", event),
            (torch.cuda, "Stream", stream),
            (torch.cuda, "current_stream", lambda *a, **k: current),
            (torch.cuda, "set_stream", lambda *a, **k: None),
            (torch.cuda, "synchronize", sync),
            (torch, "Event", event),
            (torch.accelerator, "synchronize", sync),
        ]
        saved = [(obj, name, obj.__dict__.get(name, _ABSENT)) for obj, name, _ in patches]
        for obj, name, value in patches:
            setattr(obj, name, value)
        try:
            with _CopyRecorder(self):
                yield self
        finally:
            for obj, name, value in saved:
                if value is _ABSENT:
                    delattr(obj, name)
                else:
                    setattr(obj, name, value)


_ABSENT = object()


def _poison(tensor: torch.Tensor) -> None:
    if tensor.dtype == torch.bool:
        tensor.logical_not_()
    elif tensor.is_floating_point():
        tensor.add_(1.5).mul_(-3.0)
    else:
        tensor.add_(7919)


class _CopyRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every ``copy_(dst, src, non_blocking=True)`` whose source is a registered host
    buffer as a pending device read (then lets the copy run)."""

    def __init__(self, device: RecordingDevice) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = device

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            src = args[1]
            if non_blocking and isinstance(src, torch.Tensor):
                name = self.device.host_name(src)
                if name is not None:
                    self.device.read_later(name, src, "host-to-device copy")
        return func(*args, **kwargs)
