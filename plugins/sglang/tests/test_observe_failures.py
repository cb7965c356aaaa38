"""A diagnostic never takes an sglang process down, and a bad input is one line naming it: a
trace file that cannot be written is named at start-up and the trace stays off (the rest of
the line as it would be); a bad sanitizer setting switches off only the sanitizer; a listener
that fails mid-run is switched off in one line; the trace summary refuses a file that is not
a trace naming the file and its first bad line; the sanitizer command without sglang says what
to install."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warcore_sglang import _entry
from warcore_sglang.audit import observe as _observe
from warcore_sglang.audit import sanitize, trace

# the failures of files, settings and arguments around sglang, not of its code: the newest
# release's session runs them (noxfile.py: sglang_release leaves them out)
pytestmark = pytest.mark.any_release


def _startup(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> list[tuple[int, str]]:
    """What the entry point says in a process that builds no runner: (level, line) each."""
    monkeypatch.delenv("WARCORE_SGLANG", raising=False)
    with caplog.at_level(logging.INFO, logger="warcore.sglang"):
        status = _entry.sglang_plugin()
    assert status is not None
    return [
        (r.levelno, r.getMessage()) for r in caplog.records if "warcore-sglang" in r.getMessage()
    ]


def test_a_trace_file_that_takes_nothing_is_named_in_the_one_start_up_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WARCORE_SGLANG_TRACE", "/dev/full")  # opens, and takes nothing
    monkeypatch.delenv("WARCORE_SGLANG_SANITIZE", raising=False)
    try:
        lines = _startup(monkeypatch, caplog)
    finally:
        trace.uninstall()
    assert len(lines) == 1, lines
    level, line = lines[0]
    assert level == logging.ERROR, lines
    assert "trace off: /dev/full: No space left on device" in line, lines
    assert "; trace /dev/full" not in line and "failed" not in line, lines


def test_a_folder_that_does_not_exist_keeps_the_trace_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-folder" / "trace.jsonl"
    monkeypatch.setenv("WARCORE_SGLANG_TRACE", str(missing))
    monkeypatch.delenv("WARCORE_SGLANG_SANITIZE", raising=False)
    status = _entry.Status(1, "scheduler", {}, False, None, logging.INFO)
    _entry._observe(status)
    assert status.trace is None and status.level == logging.ERROR
    assert status.problems == [f"trace off: {missing}: No such file or directory"]


def test_a_bad_sanitizer_setting_switches_off_the_sanitizer_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("WARCORE_SGLANG_TRACE", str(path))
    monkeypatch.setenv("WARCORE_SGLANG_SANITIZE", "bogus")
    try:
        lines = _startup(monkeypatch, caplog)
    finally:
        trace.uninstall()
        sanitize.uninstall()
    assert len(lines) == 1, lines
    level, line = lines[0]
    assert level == logging.WARNING, lines
    assert f"; trace {path}" in line, lines  # the trace is on
    assert "sanitizer off: WARCORE_SGLANG_SANITIZE='bogus' is not one of all, tagged" in line
    assert "not installed" not in line, lines
    kinds = [record["kind"] for record in trace.read_trace(path)]
    assert kinds == ["open", "process"], kinds


def test_a_listener_that_fails_is_switched_off_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class FullDisk:
        name = "trace"

        def barrier(self, *args: object) -> None:
            raise OSError("no space left on device")

    listener = FullDisk()
    _observe._listeners.append(listener)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="warcore_sglang"):
            _observe._each("barrier", object())
            _observe._each("barrier", object())  # switched off: not called, not logged again
    finally:
        if listener in _observe._listeners:
            _observe._listeners.remove(listener)  # type: ignore[arg-type]
    failures = [r for r in caplog.records if "stopped" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is None  # one line, no traceback
    assert "the trace stopped (OSError in barrier: no space left on device)" in caplog.text


_GOOD = {
    "kind": "barrier",
    "pid": 7,
    "mode": "DECODE",
    "record_point": "none",
    "branch": "wait_stream",
    "owner": "target",
    "provenance": "plugin:sglang",
}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\x00\xff\xfe binary", "not a trace: byte 1 is not UTF-8 text"),
        (b"[1, 2]\n", "line 1: not a trace record (a JSON object with a 'kind'), got list"),
        (b"[" * 100_000 + b"\n", "line 1: JSON nested too deeply"),
        (json.dumps({**_GOOD, "mode": None}).encode() + b"\n", "line 1: a barrier record"),
        (
            json.dumps(_GOOD).encode() + b"\n" + json.dumps({"kind": "poison"}).encode() + b"\n",
            "line 2: a poison record without 'pid'",
        ),
        (b"{not json\n" + json.dumps(_GOOD).encode() + b"\n", "line 1: not JSON"),
    ],
)
def test_the_summary_refuses_a_file_that_is_not_a_trace_naming_its_first_bad_line(
    tmp_path: Path, content: bytes, says: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "warcore_sglang.audit.trace", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr
    assert err[0] == f"python -m warcore_sglang.audit.trace: {path}: {says}" or says in err[0], err


def test_a_torn_last_line_is_a_stopped_writer_not_a_bad_trace(tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n" + json.dumps(_GOOD)[:20])
    assert trace.read_trace(path) == [_GOOD]


_HIDE = """
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("sglang", "safetensors"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
sys.argv = ["sanitize", *sys.argv[1:]]
runpy.run_module("warcore_sglang.audit.sanitize", run_name="__main__")
"""


def test_the_sanitizer_without_sglang_says_what_to_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HIDE, "--cpu-tiny-model", str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "sglang, safetensors are not installed" in err[0], err
    assert "sglang-0.5.23-server-pins.txt" in err[0] and "nox -s sglang_server" in err[0], err


def test_a_meter_file_that_takes_nothing_stops_metering_in_one_line_not_the_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``WARCORE_SGLANG_METER`` writes in ``_apply_war_barrier``'s ``finally``: a failing write
    raised into sglang's scheduler loop."""
    from warcore_sglang.activation import _meter

    class Batch:
        forward_mode = type("Mode", (), {"name": "DECODE"})()

    def run_batch(self: object, batch: object) -> str:
        return "result"

    def barrier(self: object) -> str:
        return "waited"

    good = tmp_path / "meter.jsonl"
    for file in (str(good), "/dev/full", str(tmp_path)):  # fine, full, a folder
        metered_run_batch, metered_barrier = _meter.timed_batches(run_batch, barrier, file)
        with caplog.at_level(logging.ERROR, logger="warcore.sglang"):
            for _ in range(3):
                assert metered_run_batch(None, Batch()) == "result"
                assert metered_barrier(None) == "waited"
        said = [r.getMessage() for r in caplog.records if file in r.getMessage()]
        caplog.clear()
        if file == str(good):
            assert said == []
            batches = [json.loads(line) for line in good.read_text().splitlines()]
            assert [b["mode"] for b in batches] == ["DECODE"] * 3
            assert all(b["batch_ns"] >= b["warcore_ns"] == 0 for b in batches), batches
        else:
            assert len(said) == 1 and "metering off" in said[0], said


def test_the_meter_counts_warcores_time_apart_from_the_sglang_code_it_calls(
    tmp_path: Path,
) -> None:
    """A point's warcore time leaves out sglang's original (a function or a property's getter)
    and a nested patched call; each line carries the meter's own floor."""
    import time

    from warcore_sglang.activation import _meter

    def sglangs(*args: object) -> str:
        time.sleep(0.05)
        return "sglang's"

    class Patched(property):  # as the owner's patched property: it can remember the original
        pass

    def make(original: object) -> object:  # warcore's part sleeps 10 ms around sglang's
        if isinstance(original, property):
            fget = original.fget
            assert fget is not None
            return Patched(lambda self: (time.sleep(0.01), fget(self))[1])
        assert callable(original)

        def patched(*args: object) -> object:
            time.sleep(0.01)
            return original(*args)

        patched.__name__ = getattr(original, "__name__", "?")  # as warcore's wrap() names it
        return patched

    def calls_a_point() -> object:
        return point()

    point = _meter.timed(make)(sglangs)
    prop = _meter.timed(make)(property(sglangs))
    nested = _meter.timed(make)(calls_a_point)  # sglang's code calling a patched point

    class Batch:
        forward_mode = type("Mode", (), {"name": "EXTEND"})()

    def run_batch(self: object, batch: object) -> None:
        assert point() == "sglang's" and prop.fget(None) == "sglang's"  # type: ignore[misc]
        assert nested() == "sglang's"

    file = tmp_path / "meter.jsonl"
    metered_run_batch, metered_barrier = _meter.timed_batches(run_batch, lambda s: None, str(file))
    metered_run_batch(None, Batch())
    metered_barrier(None)
    (line,) = [json.loads(text) for text in file.read_text().splitlines()]
    assert line["mode"] == "EXTEND" and line["calls"] == 3, line
    assert 0.03e9 <= line["warcore_ns"] < 0.06e9, line  # three times 10 ms, no 50 ms of sglang
    assert line["points_ns"] >= 0.03e9 + 0.15e9 > line["warcore_ns"], line
    assert 0 < line["floor_ns"] < 0.005e9, line
    by_point = line["by_point"]  # each point's own share, the nested call in its caller's
    assert set(by_point) == {"sglangs", "<lambda>", "calls_a_point"}, line
    assert sum(by_point.values()) == line["warcore_ns"], line
    assert all(0.01e9 <= ns < 0.02e9 for ns in by_point.values()), line


@pytest.mark.parametrize("control", [False, True])
def test_a_control_batch_runs_each_point_as_sglangs_own_inside_the_same_meter(
    tmp_path: Path, control: bool
) -> None:
    """``WARCORE_SGLANG_METER_CONTROL``: every other batch, each patched point (a function, a
    property) calls sglang's original in warcore's place, warcore's part never called, timed
    by the same wrappers under the same point's name; each line says whether it was a control.
    Without it every batch is warcore's."""
    import time

    from warcore_sglang.activation import _meter

    ran: list[str] = []

    def sglangs(*args: object) -> str:
        return "sglang's"

    class Patched(property):
        pass

    def make(original: object) -> object:  # warcore's part: 5 ms, its own answer
        if isinstance(original, property):
            fget = original.fget
            assert fget is not None

            def last_shared_read_runner(self: object) -> str:
                ran.append("property")
                time.sleep(0.005)
                return "warcore's" if fget(self) else "?"

            return Patched(last_shared_read_runner)

        def resolve(*args: object) -> str:
            ran.append("point")
            time.sleep(0.005)
            return "warcore's" if callable(original) and original(*args) else "?"

        return resolve

    point = _meter.timed(make)(sglangs)
    prop = _meter.timed(make)(property(sglangs))
    answers: list[tuple[str, str]] = []

    def run_batch(self: object, batch: object) -> None:
        answers.append((point(), prop.fget(None)))  # type: ignore[misc]

    class Batch:
        forward_mode = type("Mode", (), {"name": "EXTEND"})()

    file = tmp_path / "meter.jsonl"
    metered = _meter.timed_batches(run_batch, lambda s: None, str(file), control=control)
    for _ in range(4):
        metered[0](None, Batch())
        metered[1](None)
    lines = [json.loads(text) for text in file.read_text().splitlines()]
    flags = [line["control"] for line in lines]
    assert flags == ([False, True, False, True] if control else [False] * 4), lines
    for flag, line, answer in zip(flags, lines, answers, strict=True):
        assert set(line["by_point"]) == {"resolve", "last_shared_read_runner"}, line
        assert line["calls"] == 2, line
        if flag:
            assert answer == ("sglang's", "sglang's"), answers
            assert line["warcore_ns"] < 0.005e9, line  # no sleep of warcore's in it
        else:
            assert answer == ("warcore's", "warcore's"), answers
            assert line["warcore_ns"] >= 0.01e9, line
    assert ran == ["point", "property"] * (2 if control else 4), ran


def test_the_server_benchmark_quotes_real_batches_net_of_the_control_batches(
    tmp_path: Path,
) -> None:
    """The summary's figures are the real batches'; the control's beside them; the net is the
    real median minus the control's (hand-made lines: 10, 12, 14 µs real, 3, 4, 9 µs control,
    so 12 - 4 = 8 µs). A meter without controls keeps every batch."""
    from warcore_sglang.serving import bench_server

    def line(ns: int, control: bool) -> str:
        record = {"mode": "EXTEND", "warcore_ns": ns, "calls": 2, "batch_ns": 1_000_000}
        record |= {"by_point": {"resolve": ns}, "floor_ns": 500, "control": control}
        return json.dumps(record)

    real, control = [10_000, 12_000, 14_000], [3_000, 4_000, 9_000]
    meter = tmp_path / "meter.jsonl"
    rows = [line(r, False) + "\n" + line(c, True) for r, c in zip(real, control, strict=True)]
    meter.write_text("\n".join(rows) + "\n")
    extend = bench_server._per_batch(meter)["EXTEND"]
    assert extend["batches"] == 3 and extend["warcore_us_median"] == 12.0, extend
    assert extend["control"]["batches"] == 3, extend
    assert extend["control"]["warcore_us_median"] == 4.0, extend
    assert extend["net_of_control_us"] == 8.0, extend
    assert "warcore net of it: 8.0 us" in bench_server._per_batch_lines("", {"EXTEND": extend})
    meter.write_text("\n".join(line(r, False) for r in real + control) + "\n")
    plain = bench_server._per_batch(meter)["EXTEND"]
    assert plain["batches"] == 6 and "control" not in plain, plain


def test_the_server_benchmark_reads_the_activation_time_the_scheduler_says() -> None:
    """The scheduler's start-up line gained the release it names ("active on sglang 0.5.23
    in 0.125 s"); the benchmark's pattern still looked for "active in", and its activation
    figure went missing from every summary without a word."""
    from warcore_sglang._entry import Status, startup_line
    from warcore_sglang.serving import bench_server

    status = Status(7, "scheduler", {"tp": 0}, True, None, logging.INFO)
    status.activation_s, status.release = 0.125, "0.5.23"
    line = startup_line(status)
    found = bench_server._ACTIVE.search(f"[2026-12-05 11:00:00 TP0] {line}\n")
    assert found is not None and float(found.group(1)) == 0.125, line
    for role in ("prefill scheduler", "decode scheduler"):  # a PD side's scheduler counts too
        status.role = role
        assert bench_server._ACTIVE.search(startup_line(status)) is not None, role
    status.role = "detokenizer"  # only the scheduler's line counts
    assert bench_server._ACTIVE.search(startup_line(status)) is None


@pytest.mark.parametrize(
    ("value", "meter", "says"),
    [
        ("2", "m.jsonl", "is neither on (1, true, yes, on) nor off (0, false, no, off)"),
        ("ture", "m.jsonl", "is neither on"),
        ("1", "", "is on without WARCORE_SGLANG_METER=FILE"),
    ],
)
def test_a_bad_meter_control_is_said_at_start_up_and_leaves_no_control_batch(
    value: str,
    meter: str,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``WARCORE_SGLANG_METER_CONTROL`` spelled as every switch: a typo, or on without the
    meter, is one warning in the start-up line naming the variable, and no batch is a
    control; ``yes`` with the meter is on, without a word."""
    from warcore_sglang.activation import _meter

    monkeypatch.delenv("WARCORE_SGLANG_TRACE", raising=False)
    monkeypatch.setenv("WARCORE_SGLANG_METER", meter)
    monkeypatch.setenv("WARCORE_SGLANG_METER_CONTROL", value)
    lines = _startup(monkeypatch, caplog)
    assert len(lines) == 1 and lines[0][0] == logging.WARNING, lines
    assert "WARCORE_SGLANG_METER_CONTROL" in lines[0][1] and says in lines[0][1], lines
    assert "no control batches" in lines[0][1], lines
    assert _meter.control() is False
    monkeypatch.setenv("WARCORE_SGLANG_METER", "m.jsonl")
    monkeypatch.setenv("WARCORE_SGLANG_METER_CONTROL", "yes")
    assert _meter.control() is True
    caplog.clear()
    assert not any("METER" in line for _, line in _startup(monkeypatch, caplog))


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WARCORE_SGLANG_CHECK_RANKS", "ture"),
        ("WARCORE_SGLANG_CHECK_RANKS", "2"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "abc"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "1_0"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "\u0661\u0662"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "1e300"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "0"),
        ("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "nan"),
    ],
)
def test_a_bad_rank_check_setting_is_said_at_start_up_and_falls_back(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo turned the check off without a word, and a bad timeout raised at the end of
    ``Scheduler.__init__`` (after the model loaded) or, as ``1e300``, waited for good."""
    from warcore_sglang.activation import _ranks

    from warcore.audit.ranks import DEFAULT_TIMEOUT_S

    monkeypatch.delenv("WARCORE_SGLANG_TRACE", raising=False)
    monkeypatch.delenv("WARCORE_SGLANG_CHECK_RANKS", raising=False)
    monkeypatch.delenv("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", raising=False)
    monkeypatch.setenv(variable, value)
    lines = _startup(monkeypatch, caplog)
    assert len(lines) == 1 and lines[0][0] == logging.WARNING, lines
    assert f"{variable}={value!r} is not" in lines[0][1], lines
    assert _ranks._mode() is None and _ranks.timeout() == DEFAULT_TIMEOUT_S
    monkeypatch.setenv("WARCORE_SGLANG_CHECK_RANKS", "warn")
    monkeypatch.setenv("WARCORE_SGLANG_CHECK_RANKS_TIMEOUT", "20.5")
    assert (_ranks._mode(), _ranks.timeout()) == ("warn", 20.5)
    caplog.clear()
    assert not any("CHECK_RANKS" in line for _, line in _startup(monkeypatch, caplog))


@pytest.mark.parametrize(
    ("command", "args", "culprit"),
    [
        ("serving.bench", ["--calls", "1_0"], "--calls"),
        ("serving.bench", ["--repeat", "0"], "--repeat"),
        ("serving.bench", ["--json", "{folder}"], "--json"),
        ("serving.bench_server", ["--timeout", "nan"], "--timeout"),
        ("serving.bench_server", ["--rounds", "-1"], "--rounds"),
        ("serving.bench_server", ["--json", "{folder}"], "--json"),
        ("audit.sanitize", ["--requests", "-3"], "--requests"),
        ("audit.sanitize", ["--timeout", "nan"], "--timeout"),
        ("audit.sanitize", ["--json", "{folder}"], "--json"),
    ],
)
def test_the_commands_refuse_a_bad_argument_in_one_line_before_running(
    command: str, args: list[str], culprit: str, tmp_path: Path
) -> None:
    """A bad number or an output that is a folder was found after minutes of measuring (or
    after starting a server), as a traceback."""
    argv = [a.format(folder=tmp_path) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", f"warcore_sglang.{command}", *argv],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and culprit in done.stderr.splitlines()[-1], done.stderr
    assert "round" not in done.stdout and "warm-up" not in done.stdout  # nothing was measured
