"""A Chrome / Perfetto trace of an engine run, and the timeline the overlap benchmarks measure.

:class:`TraceRecorder` is an :class:`~warcore.engine.EngineObserver` that keeps everything the
engine reports (host phases, the sim device's work items, forwards with their record points,
barriers). :class:`Timeline` turns that into forwards on the forward stream, the read-done
record's device time, the forward stream's idle gaps and the schedule stream's fence waits.
:func:`chrome_trace` writes the Chrome trace-event format (a ``traceEvents`` list), which
https://ui.perfetto.dev (Open trace file) and ``chrome://tracing`` load.

What is measured and what is derived:

* host spans, device work items and barrier instants are measured (``time.perf_counter``);
* a forward is the run of forward-stream items from one ``load_batch`` to the next; the n-th
  such run is the n-th forward the runners reported (the stream is FIFO and the host launches
  forwards in order);
* the read-done record's device time is derived from its record point: ``PRE_REPLAY`` at the
  end of ``out_graph_init``, ``IN_GRAPH_NODE``/``AFTER_IN_GRAPH_INIT`` at the end of
  ``in_graph_init``, ``POST_REPLAY`` at the end of the body (``sample``). Without device spans
  (CUDA reports none) the host time of the launch is used, and the event says so;
* a schedule-stream wait is derived from its barrier: it starts when both the host issued it
  and the schedule stream finished what was queued before it, and ends at the read-done record
  (fine) or at the end of the forward-stream work launched before it (coarse).
"""

from __future__ import annotations

import bisect
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from warcore._files import write_text
from warcore.core import ForwardMode, RecordPoint
from warcore.device import WaitBinding
from warcore.engine.observe import EngineObserver

__all__ = [
    "FORWARD_STREAM",
    "SCHEDULE_STREAM",
    "BarrierRecord",
    "BindingRecord",
    "DeviceSpan",
    "ForwardRecord",
    "ForwardTimeline",
    "HostSpan",
    "TraceRecorder",
    "Timeline",
    "WaitSpan",
    "chrome_trace",
    "write_chrome_trace",
]

FORWARD_STREAM = "forward"
SCHEDULE_STREAM = "schedule"
_FIRST_ITEM = "load_batch"
"""Every forward starts with this work item on the forward stream (``ModelRunner.load_batch``)."""
_LAST_ITEM = "emit"
"""Every forward of a run launches this item (``ModelRunner.emit``); capture warm-ups do not."""
_BODY_ITEMS = ("embed", "sample")
"""First and last work item of the model body (``ModelRunner.body``)."""


class HostSpan(NamedTuple):
    name: str
    t0: float
    t1: float
    args: dict[str, object]


class DeviceSpan(NamedTuple):
    stream: str
    label: str
    t0: float
    t1: float


class ForwardRecord(NamedTuple):
    runner: str
    mode: ForwardMode
    point: RecordPoint
    t: float
    """Host time at which the runner finished launching the forward."""


class BarrierRecord(NamedTuple):
    kind: str
    t: float


class BindingRecord(NamedTuple):
    binding: WaitBinding
    t: float


class TraceRecorder(EngineObserver):
    """Keeps every observation of a run (or of several runs, one after another)."""

    def __init__(self) -> None:
        self.host: list[HostSpan] = []
        self.device: list[DeviceSpan] = []
        self.forwards: list[ForwardRecord] = []
        self.barriers: list[BarrierRecord] = []
        self.bindings: list[BindingRecord] = []
        # device_span arrives from every stream's worker thread at once; the lock keeps the
        # list consistent on any interpreter (a few hundred ns against ms-long work items).
        self._lock = threading.Lock()

    def host_span(self, name: str, t0: float, t1: float, args: dict[str, object]) -> None:
        self.host.append(HostSpan(name, t0, t1, dict(args)))

    def device_span(self, stream: str, label: str, t0: float, t1: float) -> None:
        with self._lock:
            self.device.append(DeviceSpan(stream, label, t0, t1))

    def forward(self, runner: str, mode: ForwardMode, point: RecordPoint, t: float) -> None:
        self.forwards.append(ForwardRecord(runner, mode, point, t))

    def barrier(self, kind: str, t: float) -> None:
        self.barriers.append(BarrierRecord(kind, t))

    def binding(self, binding: WaitBinding, t: float) -> None:
        self.bindings.append(BindingRecord(binding, t))

    def clear(self) -> None:
        with self._lock:
            self.bindings.clear()
            self.host.clear()
            self.device.clear()
            self.forwards.clear()
            self.barriers.clear()


@dataclass
class ForwardTimeline:
    """One forward: what the runner reported, and its work items on the forward stream."""

    record: ForwardRecord | None
    items: list[DeviceSpan] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.items[0].t0

    @property
    def end(self) -> float:
        return self.items[-1].t1

    @property
    def busy(self) -> float:
        return sum(s.t1 - s.t0 for s in self.items)

    def _end_of(self, label: str) -> float | None:
        for span in self.items:
            if span.label == label:
                return span.t1
        return None

    def body(self) -> tuple[float, float] | None:
        first, last = _BODY_ITEMS
        t0 = next((s.t0 for s in self.items if s.label == first), None)
        t1 = self._end_of(last)
        return None if t0 is None or t1 is None else (t0, t1)

    def read_done_t(self) -> float | None:
        """Device time of this forward's read-done record; ``None`` if it records none or the
        items are missing."""
        if self.record is None:
            return None
        point = self.record.point
        if point is RecordPoint.PRE_REPLAY:
            return self._end_of("out_graph_init")
        if point in (RecordPoint.IN_GRAPH_NODE, RecordPoint.AFTER_IN_GRAPH_INIT):
            return self._end_of("in_graph_init")
        if point is RecordPoint.POST_REPLAY:
            body = self.body()
            return None if body is None else body[1]
        return None


class WaitSpan(NamedTuple):
    kind: str
    t0: float
    t1: float


class Timeline:
    """The recorded run as forwards, gaps and waits (see the module docstring)."""

    def __init__(self, recorder: TraceRecorder) -> None:
        self.recorder = recorder
        by_stream: dict[str, list[DeviceSpan]] = {}
        for span in recorder.device:
            by_stream.setdefault(span.stream, []).append(span)
        for spans in by_stream.values():
            spans.sort(key=lambda s: s.t0)
        self.streams = by_stream
        groups: list[list[DeviceSpan]] = []
        for span in by_stream.get(FORWARD_STREAM, []):
            if span.label == _FIRST_ITEM or not groups:
                groups.append([])
            groups[-1].append(span)
        # A forward of the run ends its launches with ``emit``; a group without one is work
        # that was still queued when the run began (the warm-up of graph capture at engine
        # construction): kept as device work, but not a forward.
        self.other = [g for g in groups if not any(s.label == _LAST_ITEM for s in g)]
        groups = [g for g in groups if any(s.label == _LAST_ITEM for s in g)]
        records = recorder.forwards
        # Pair in order; a record without a group (a device that reports no spans) is
        # "unplaced".
        self.forwards = [
            ForwardTimeline(records[i] if i < len(records) else None, grp)
            for i, grp in enumerate(groups)
        ]
        self.unplaced = list(records[len(groups) :])
        """Forwards without device spans (CUDA, or a run cut short)."""

    def forward_gaps(self) -> list[float]:
        """Idle seconds of the forward stream between consecutive forwards."""
        fw = self.forwards
        return [max(0.0, b.start - a.end) for a, b in zip(fw, fw[1:], strict=False)]

    def busy(self, stream: str) -> float:
        return sum(s.t1 - s.t0 for s in self.streams.get(stream, []))

    def waits(self) -> list[tuple[BarrierRecord, WaitSpan | None]]:
        """Each barrier with the schedule-stream wait it caused (``None``: no wait, or no
        device spans to derive it from)."""
        placed = [f for f in self.forwards if f.record is not None]
        hosts = [f.record.t for f in placed if f.record is not None]
        sched = self.streams.get(SCHEDULE_STREAM, [])
        starts = [s.t0 for s in sched]
        # Ends of the schedule items, running maximum: "everything queued before t finished".
        ends: list[float] = []
        for s in sched:
            ends.append(max(s.t1, ends[-1]) if ends else s.t1)
        out: list[tuple[BarrierRecord, WaitSpan | None]] = []
        last_end = float("-inf")
        for barrier in self.recorder.barriers:
            release = self._release(barrier, placed, hosts)
            if release is None:
                out.append((barrier, None))
                continue
            # Items launched after the barrier cannot start before the wait releases, so the
            # items that started earlier are exactly those queued ahead of the wait.
            i = bisect.bisect_left(starts, release)
            start = max(barrier.t, ends[i - 1] if i else barrier.t, last_end)
            # Waits on one stream run one after another: never before the previous one ended.
            last_end = max(last_end, release)
            out.append(
                (barrier, WaitSpan(barrier.kind, start, release) if release > start else None)
            )
        return out

    @staticmethod
    def _release(
        barrier: BarrierRecord, placed: list[ForwardTimeline], hosts: list[float]
    ) -> float | None:
        if barrier.kind not in ("fine", "coarse"):
            return None
        n = bisect.bisect_right(hosts, barrier.t)  # forwards launched before the barrier
        if n == 0:
            return None
        if barrier.kind == "coarse":
            last = placed[n - 1]
            return last.end if last.items else None
        for f in reversed(placed[:n]):  # the latest publishing forward filled the mailbox
            if f.record is not None and f.record.point.publishes:
                return f.read_done_t()
        return None


# -- Chrome trace-event format ---------------------------------------------------------------

_PID = 1
_HOST_TID = 1


def chrome_trace(recorder: TraceRecorder, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run as a Chrome trace-event JSON object (timestamps in µs from the first event)."""
    tl = Timeline(recorder)
    streams = [FORWARD_STREAM, SCHEDULE_STREAM] + sorted(
        s for s in tl.streams if s not in (FORWARD_STREAM, SCHEDULE_STREAM)
    )
    tids = {name: _HOST_TID + 1 + i for i, name in enumerate(streams)}
    body = _Body(recorder)
    for h in recorder.host:
        body.span(_HOST_TID, h.t0, h.t1, h.name, "host", _jsonable(h.args))
    for d in recorder.device:
        body.span(tids[d.stream], d.t0, d.t1, d.label, _device_cat(d.label), {})
    _forwards(body, tl, tids[FORWARD_STREAM])
    for f in tl.forwards:
        _read_done(body, f.record, f.read_done_t(), tids[FORWARD_STREAM])
    for rec in tl.unplaced:
        _read_done(body, rec, None, tids[FORWARD_STREAM])
    _barriers(body, tl, tids[SCHEDULE_STREAM])
    _bindings(body, recorder)
    events: list[dict[str, Any]] = [_meta("process_name", 0, {"name": "warcore engine"})]
    names = {_HOST_TID: "host"} | {tid: f"{name} stream" for name, tid in tids.items()}
    for tid, label in sorted(names.items()):
        events.append(_meta("thread_name", tid, {"name": label}))
        events.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
    return {
        "traceEvents": events + body.events(),
        "displayTimeUnit": "ms",
        "otherData": {"generator": "warcore run --trace", **(metadata or {})},
    }


class _Body:
    """The trace's timed events, each kept as (tid, start ns, end ns or ``None`` for an
    instant, the event without ``ts``/``dur``) until :meth:`events` orders them."""

    def __init__(self, recorder: TraceRecorder) -> None:
        times = [t for s in recorder.host for t in (s.t0, s.t1)]
        times += [s.t0 for s in recorder.device] + [b.t for b in recorder.barriers]
        times += [f.t for f in recorder.forwards]
        self.origin = min(times, default=0.0)
        self.items: list[tuple[int, int, int | None, dict[str, Any]]] = []

    def _ns(self, t: float) -> int:
        return round((t - self.origin) * 1e9)

    def span(
        self, tid: int, t0: float, t1: float, name: str, cat: str, args: dict[str, Any]
    ) -> None:
        event = {"ph": "X", "name": name, "cat": cat, "args": args}
        self.items.append((tid, self._ns(t0), self._ns(t1), event))

    def instant(self, tid: int, t: float, name: str, cat: str, args: dict[str, Any]) -> None:
        event = {"ph": "i", "s": "t", "name": name, "cat": cat, "args": args}
        self.items.append((tid, self._ns(t), None, event))

    def events(self) -> list[dict[str, Any]]:
        """Per track by time; at equal start the longer span first, so enclosing spans
        (forward, model body) precede what they contain and the file order is also the
        nesting order."""
        items = sorted(
            self.items, key=lambda e: (e[0], e[1], -(e[2] - e[1]) if e[2] is not None else 0)
        )
        out = []
        for tid, start, end, event in items:
            event.update(pid=_PID, tid=tid, ts=start / 1000)
            if end is not None:
                event["dur"] = (end - start) / 1000
            out.append(event)
        return out


def _forwards(body: _Body, tl: Timeline, tid: int) -> None:
    """Each forward that has device spans as one span over them, and its model body."""
    for f in tl.forwards:
        if not f.items:
            continue
        rec = f.record
        args = {} if rec is None else _forward_args(rec)
        name = "forward" if rec is None else f"forward {rec.mode.name} ({rec.runner})"
        body.span(tid, f.start, f.end, name, "forward", args)
        body_span = f.body()
        if body_span is not None:
            body.span(tid, *body_span, "model body", "forward", {})


def _barriers(body: _Body, tl: Timeline, schedule_tid: int) -> None:
    """Each barrier as a host instant, and the schedule-stream wait it caused (derived)."""
    for barrier, wait in tl.waits():
        kind = barrier.kind
        body.instant(_HOST_TID, barrier.t, f"barrier {kind}", "barrier", {"kind": kind})
        if wait is not None:
            what = "read-done event" if wait.kind == "fine" else "forward stream"
            args = {"fence": wait.kind, "waits_for": what, "derived": True}
            body.span(schedule_tid, wait.t0, wait.t1, f"wait {wait.kind}", "wait", args)


def _bindings(body: _Body, recorder: TraceRecorder) -> None:
    """Each wait on a read-done event as a host instant: the forward it meant, the record it
    bound to, and the verdict (``bound``, ``earlier``, ``later``)."""
    for rec in recorder.bindings:
        b = rec.binding
        bound = b.bound.forward if b.bound is not None else None
        args = {
            "consumer": b.consumer,
            "meant": b.meant.describe() if b.meant is not None else None,
            "bound_to": bound.describe() if bound is not None else None,
            "generation": b.bound.generation if b.bound is not None else None,
            "verdict": b.verdict,
        }
        name = f"{b.consumer} wait {b.verdict}"
        body.instant(_HOST_TID, rec.t, name, "binding", args)


def write_chrome_trace(
    recorder: TraceRecorder, path: str | Path, metadata: dict[str, Any] | None = None
) -> int:
    """Write :func:`chrome_trace` to ``path``, whole or not at all (missing folders are
    created: :func:`warcore._files.write_text`); returns the number of events."""
    trace = chrome_trace(recorder, metadata)
    write_text(path, json.dumps(trace, separators=(",", ":")) + "\n")
    return len(trace["traceEvents"])


def _read_done(
    body: _Body, rec: ForwardRecord | None, device_t: float | None, forward_tid: int
) -> None:
    """A publishing forward's read-done record: on the forward stream at its derived device
    time, or on the host at the launch when there is none."""
    if rec is None or not rec.point.publishes:
        return
    name, args = f"read-done {rec.point.value}", _forward_args(rec)
    if device_t is not None:
        clock = {"clock": "device (derived from the record point)"}
        body.instant(forward_tid, device_t, name, "read_done", args | clock)
    else:
        body.instant(
            _HOST_TID, rec.t, name, "read_done", args | {"clock": "host (no device spans)"}
        )


def _forward_args(rec: ForwardRecord) -> dict[str, Any]:
    return {"runner": rec.runner, "mode": rec.mode.name, "record_point": rec.point.value}


def _device_cat(label: str) -> str:
    if label.startswith("schedule_"):
        return "schedule"
    if label in ("out_graph_init", "in_graph_init"):
        return "metadata"
    return "forward"


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": _PID, "tid": tid, "ts": 0, "args": args}


def _jsonable(args: dict[str, object]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
        for k, v in args.items()
    }
