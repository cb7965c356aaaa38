"""SIGINT and SIGTERM in the middle of a long command: one line, exit 130 (143), and no output
file left behind, whole or half-written (issue 27: a full KeyboardInterrupt traceback).

Each command really runs in its own process and is signalled once it is under way (its own
progress output says so); nothing here stands in for the engine or the benchmark."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _support.signals import sigint_as_a_terminal_sends_it

# real subprocesses of warcore run, soak and bench: the signal handling, whatever the plugins
pytestmark = pytest.mark.plugin_agnostic

STARTED_WITHIN_S = 180.0
STOPPED_WITHIN_S = 60.0


def _signalled(
    args: list[str], marker: bytes, sig: signal.Signals, cwd: Path, *, on: str = "stderr"
) -> tuple[int, str, str]:
    """Start ``warcore ARGS`` (stderr a terminal, so progress lines show), wait until
    ``marker`` is on its ``on`` stream, send ``sig``: its exit status, stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "warcore", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=cwd,
        env=env,
        preexec_fn=sigint_as_a_terminal_sends_it,
    )
    os.close(slave)
    assert proc.stdout is not None
    streams = {"stderr": master, "stdout": proc.stdout.fileno()}
    seen = {"stderr": b"", "stdout": b""}
    try:
        _read_until(streams, seen, lambda: marker in seen[on], STARTED_WITHIN_S)
        proc.send_signal(sig)
        _read_until(streams, seen, lambda: not streams, STOPPED_WITHIN_S)
        code = proc.wait(timeout=STOPPED_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        proc.stdout.close()
    return code, seen["stdout"].decode(), seen["stderr"].decode()


def _read_until(
    streams: dict[str, int], seen: dict[str, bytes], done: Callable[[], bool], within_s: float
) -> None:
    """Read what the process writes until ``done()``; a stream at its end leaves ``streams``."""
    deadline = time.monotonic() + within_s
    while not done():
        left = deadline - time.monotonic()
        ready, _, _ = select.select(list(streams.values()), [], [], max(0.0, left))
        assert ready, f"timed out: {seen}"
        for name, fd in list(streams.items()):
            if fd in ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # a terminal whose other side closed
                    chunk = b""
                if not chunk:
                    del streams[name]
                seen[name] += chunk
        assert streams or done(), f"ended before it got under way: {seen}"


def _last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.replace("\r", "\n").strip().splitlines()[-1]


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_with_a_trace_stops_with_one_line_and_writes_no_trace(
    sig: signal.Signals, status: int, tmp_path: Path
) -> None:
    trace = tmp_path / "out" / "run.json"
    args = ["run", "--device", "sim", "--requests", "2000", "--progress", "always"]
    code, out, err = _signalled([*args, "--trace", str(trace)], b"run [", sig, tmp_path)
    assert code == status, err
    assert (
        _last_line(err) == f"warcore: {sig.name}: stopped; no output file was left half-written"
    ), err
    assert out == ""
    assert not trace.parent.exists() or list(trace.parent.iterdir()) == []


def test_soak_stops_with_one_line(tmp_path: Path) -> None:
    args = ["soak", "--steps", "1000000", "--progress"]
    code, _, err = _signalled(args, b"steps (", signal.SIGINT, tmp_path, on="stdout")
    assert code == 130, err
    assert _last_line(err) == "warcore: SIGINT: stopped; no output file was left half-written", err


def test_bench_overlap_stops_with_one_line_and_writes_no_result(tmp_path: Path) -> None:
    result = tmp_path / "overlap.json"
    args = ["bench", "overlap", "--requests", "24", "--repeat", "50", "--json", str(result)]
    code, _, err = _signalled(args, b"calibrating", signal.SIGTERM, tmp_path)
    assert code == 143, err
    assert _last_line(err) == "warcore: SIGTERM: stopped; no output file was left half-written", err
    assert list(tmp_path.iterdir()) == []


# -- the writer every output goes through ----------------------------------------------------


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    from warcore._files import replaced_on_success

    target = tmp_path / "result.json"
    target.write_text("the previous result")
    with pytest.raises(KeyboardInterrupt), replaced_on_success(target) as part:
        part.write_text('{"half": ')
        raise KeyboardInterrupt
    assert target.read_text() == "the previous result"
    assert list(tmp_path.iterdir()) == [target]
    with replaced_on_success(target) as part:
        part.write_text("the new result")
    assert target.read_text() == "the new result"
    assert list(tmp_path.iterdir()) == [target]
