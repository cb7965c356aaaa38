"""``python -m warcore_sglang.audit.trace FILE`` on the trace of a real server run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

from _servers import Servers


def test_the_summary_counts_the_barriers_of_a_real_run(servers: Servers) -> None:
    run = servers["fork_alone"]
    done = subprocess.run(
        [sys.executable, "-m", "warcore_sglang.audit.trace", str(run.trace_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    summary = json.loads(done.stdout)
    (scheduler,) = summary["schedulers"]
    barriers = run.kind("barrier")
    assert scheduler["barriers"] == len(barriers)
    assert scheduler["fine"] == sum(b["branch"] == "wait_event" for b in barriers) == 4
    assert scheduler["coarse"] == sum(b["branch"] == "wait_stream" for b in barriers)
    rows = {(r["mode"], r["record_point"], r["branch"]): r["barriers"] for r in scheduler["rows"]}
    expected = Counter((b["mode"], b["record_point"], b["branch"]) for b in barriers)
    assert rows == dict(expected)
    assert {p["role"] for p in summary["processes"]} == {"engine", "scheduler", "detokenizer"}
    text = subprocess.run(
        [sys.executable, "-m", "warcore_sglang.audit.trace", str(run.trace_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "EXTEND" in text and "pre_replay" in text and "barriers        coarse" in text
    print(text)
