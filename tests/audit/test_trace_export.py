"""``warcore run --trace FILE``: a Chrome/Perfetto trace-event file of the host and both streams.

The file is loaded as JSON and checked for what a reader relies on: named tracks, complete and
instant events of the documented kinds, per-track monotonic timestamps, read-done instants at
the device point their record point names, and a barrier instant per barrier.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from warcore import cli
from warcore.audit.trace_export import (
    DeviceSpan,
    ForwardRecord,
    Timeline,
    TraceRecorder,
    chrome_trace,
)
from warcore.core import ForwardMode, RecordPoint

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

Event = dict[str, Any]


def _run_traced(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    path = tmp_path / "run.trace.json"
    argv = ["run", "--device", "sim", "--requests", "6", "--progress", "never", "--no-verify"]
    code = cli.main([*argv, "--layer-ms", "0.5", "--schedule-ms", "1", *args, "--trace", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"events in {path}" in out
    trace: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return trace


def _tracks(trace: dict[str, Any]) -> dict[str, int]:
    return {
        e["args"]["name"]: e["tid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def _by_track(trace: dict[str, Any]) -> dict[int, list[Event]]:
    tracks: dict[int, list[Event]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] != "M":
            tracks[e["tid"]].append(e)
    return tracks


def _check_structure(trace: dict[str, Any]) -> dict[str, int]:
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    tracks = _tracks(trace)
    assert {"host", "forward stream", "schedule stream"} <= set(tracks)
    assert len(set(tracks.values())) == len(tracks)  # one tid per track
    for e in events:
        assert e["ph"] in ("M", "X", "i"), e
        assert e["pid"] == 1 and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] == "t"
    for tid, track in _by_track(trace).items():
        ts = [e["ts"] for e in track]
        assert ts == sorted(ts), f"timestamps of track {tid} are not monotonic"
        # Complete events on a track nest or follow each other, never overlap partially
        # (Perfetto drops or misdraws improperly nested slices). 1 ns of rounding allowed.
        open_ends: list[float] = []
        for e in (e for e in track if e["ph"] == "X"):
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"track {tid}: {e}"
            open_ends.append(end)
    return tracks


@pytest.mark.plugins("trtllm_mha")
def test_fine_fence_trace_has_every_kind_of_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    trace = _run_traced(tmp_path, capsys, "--backend", "trtllm_mha")
    tracks = _check_structure(trace)
    by_track = _by_track(trace)
    host, fwd, sched = (by_track[tracks[n]] for n in ("host", "forward stream", "schedule stream"))

    spans = Counter(e["name"] for e in fwd if e["ph"] == "X")
    for name in ("load_batch", "out_graph_init", "in_graph_init", "model body", "layer0", "emit"):
        assert spans[name] > 0, name
    assert any(n.startswith("forward DECODE") for n in spans)
    assert any(n.startswith("forward EXTEND") for n in spans)
    sched_spans = Counter(e["name"] for e in sched if e["ph"] == "X")
    assert sched_spans["schedule_write"] > 0 and sched_spans["schedule_copy"] > 0
    assert sched_spans["wait fine"] > 0
    assert {"schedule", "launch", "collect"} <= {e["name"] for e in host if e["ph"] == "X"}

    barriers = [e for e in host if e["ph"] == "i" and e["cat"] == "barrier"]
    assert barriers and {b["args"]["kind"] for b in barriers} == {"fine"}
    assert trace["otherData"]["fence"] == "fine"

    # Every forward publishes here (trtllm_mha: EXTEND before the replay, DECODE at the node),
    # each read-done sits on the forward stream at the end of the init its point names.
    read_done = [e for e in fwd if e["ph"] == "i" and e["cat"] == "read_done"]
    forwards = [e for e in fwd if e["ph"] == "X" and e["name"].startswith("forward ")]
    assert len(read_done) == len(forwards)
    ends = defaultdict(set)
    for e in fwd:
        if e["ph"] == "X":
            ends[e["name"]].add(round(e["ts"] + e["dur"], 3))
    where = {"pre_replay": "out_graph_init", "in_graph_node": "in_graph_init"}
    for e in read_done:
        point = e["args"]["record_point"]
        assert point in where, point
        assert round(e["ts"], 3) in ends[where[point]], e
        assert e["args"]["clock"].startswith("device")

    # Each forward span encloses its work items: nesting is what Perfetto draws.
    items = [e for e in fwd if e["ph"] == "X" and e not in forwards and e["name"] != "model body"]
    for f in forwards:
        inside = [i for i in items if f["ts"] <= i["ts"] < f["ts"] + f["dur"]]
        assert all(i["ts"] + i["dur"] <= f["ts"] + f["dur"] + 1e-3 for i in inside)


@pytest.mark.plugin_agnostic
def test_torch_native_prefill_takes_the_coarse_fence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    trace = _run_traced(tmp_path, capsys, "--backend", "torch_native")
    tracks = _check_structure(trace)
    by_track = _by_track(trace)
    host, fwd = by_track[tracks["host"]], by_track[tracks["forward stream"]]
    kinds = Counter(e["args"]["kind"] for e in host if e["ph"] == "i" and e["cat"] == "barrier")
    assert kinds["coarse"] > 0 and kinds["fine"] > 0  # prefill: nothing declared; decode: node
    modes = {e["args"]["mode"] for e in fwd if e["ph"] == "i" and e["cat"] == "read_done"}
    assert modes == {"DECODE"}
    waits = {e["name"] for e in by_track[tracks["schedule stream"]] if e.get("cat") == "wait"}
    assert "wait coarse" in waits


@pytest.mark.plugin_agnostic
def test_coarse_fence_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    trace = _run_traced(tmp_path, capsys, "--fence", "coarse")
    tracks = _check_structure(trace)
    host = _by_track(trace)[tracks["host"]]
    kinds = {e["args"]["kind"] for e in host if e["ph"] == "i" and e["cat"] == "barrier"}
    assert kinds == {"coarse"}


def test_trace_to_an_unwritable_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    target = tmp_path / "a-file"
    target.write_text("", encoding="utf-8")
    argv = ["run", "--device", "sim", "--requests", "2", "--progress", "never", "--no-verify"]
    code = cli.main([*argv, "--trace", str(target / "sub" / "t.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("warcore: error: --trace") and err.count("\n") == 1


# -- the timeline, from hand-made observations -------------------------------------------------


def _forward(rec: TraceRecorder, t: float, *, published: bool = True) -> None:
    """One forward at ``t``: items 1 ms apart on the forward stream."""
    labels = ["load_batch", "out_graph_init", "in_graph_init", "embed", "layer0", "sample"]
    for i, label in enumerate([*labels, "emit", "commit"]):
        rec.device_span("forward", label, t + i * 1e-3, t + (i + 1) * 1e-3)


def test_timeline_pairs_forwards_and_derives_record_times() -> None:
    rec = TraceRecorder()
    # Left over from graph capture: a forward-like group without emit, not a forward.
    for i, label in enumerate(["load_batch", "out_graph_init", "in_graph_init", "sample"]):
        rec.device_span("forward", label, i * 1e-3, (i + 1) * 1e-3)
    points = [RecordPoint.PRE_REPLAY, RecordPoint.IN_GRAPH_NODE, RecordPoint.POST_REPLAY]
    starts = [0.010, 0.020, 0.032]
    for start, point in zip(starts, points, strict=True):
        _forward(rec, start)
        rec.forward("target", ForwardMode.DECODE, point, start)
        rec.barrier("fine", start + 0.0001)
    rec.device_span("schedule", "schedule_write", 0.0101, 0.0102)
    tl = Timeline(rec)
    assert len(tl.other) == 1 and len(tl.forwards) == 3 and not tl.unplaced
    got = [f.read_done_t() for f in tl.forwards]
    assert got == pytest.approx([0.012, 0.023, 0.038])  # ends of out-init, in-init, sample
    assert tl.forward_gaps() == pytest.approx([0.002, 0.004])
    waits = tl.waits()
    assert [w is not None for _, w in waits] == [True, True, True]
    first = waits[0][1]
    assert first is not None and first.t0 == pytest.approx(0.0102)  # after the queued write
    assert first.t1 == pytest.approx(0.012)


def test_without_device_spans_read_done_is_on_the_host_clock() -> None:
    rec = TraceRecorder()  # what a CUDA run reports: no device spans
    rec.host_span("launch", 1.0, 1.001, {"step": 0})
    rec.forward("target", ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE, 1.0005)
    rec.forward("target", ForwardMode.EXTEND, RecordPoint.NONE, 1.002)
    rec.barrier("fine", 1.0011)
    trace = chrome_trace(rec)
    host = _by_track(trace)[1]
    read_done = [e for e in host if e["cat"] == "read_done"]
    assert len(read_done) == 1 and read_done[0]["args"]["clock"].startswith("host")
    assert [e["name"] for e in host if e["cat"] == "barrier"] == ["barrier fine"]
    assert Timeline(rec).waits()[0][1] is None


def test_device_span_sink_is_safe_from_many_threads() -> None:
    import threading

    rec = TraceRecorder()

    def work(stream: str) -> None:
        for i in range(2000):
            rec.device_span(stream, "x", i, i + 1)

    threads = [threading.Thread(target=work, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rec.device) == 8000
    assert all(isinstance(s, DeviceSpan) for s in rec.device)
    assert isinstance(ForwardRecord("r", ForwardMode.DECODE, RecordPoint.NONE, 0.0), tuple)
