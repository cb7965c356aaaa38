"""``python -m warcore_sglang.audit.trace`` compares ranks batch by batch, from one trace file or
one per node (two nodes write two files; their pids may even coincide)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from warcore_sglang.audit.trace_ranks import compare_ranks

pytestmark = pytest.mark.any_release  # trace files, whichever sglang wrote them


def _barrier(tp: int, step: int, mode: str, point: str, branch: str) -> dict[str, Any]:
    return {
        "kind": "barrier",
        "pid": 100,  # the same pid on both nodes: told apart by file
        "rank": {"tp": tp, "pp": 0, "dp": None},
        "step": step,
        "mode": mode,
        "record_point": point,
        "branch": branch,
        "owner": "target",
        "provenance": "plugin:sglang",
        "rids": ["r1"] if mode == "EXTEND" else [],
    }


STEPS = [("EXTEND", "pre_replay", "wait_event"), ("DECODE", "none", "wait_stream")] * 3


def _node(path: Path, tp: int, steps: list[tuple[str, str, str]]) -> Path:
    lines = [json.dumps(_barrier(tp, n, *step)) for n, step in enumerate(steps, 1)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _cli(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warcore_sglang.audit.trace", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_two_nodes_files_that_agree(tmp_path: Path) -> None:
    a, b = _node(tmp_path / "a.jsonl", 0, STEPS), _node(tmp_path / "b.jsonl", 1, STEPS)
    done = _cli(a, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "barriers per rank: tp 0 (file 1) 6, tp 1 (file 2) 6 (DECODE 3, EXTEND 3)" in (
        done.stdout
    )
    assert "every rank took the same record point and barrier on every batch" in done.stdout


def test_a_divergence_names_the_batch_the_ranks_and_both_decisions(tmp_path: Path) -> None:
    late = list(STEPS)
    late[2] = ("EXTEND", "none", "wait_stream")  # rank 1 published nothing for batch 3
    a, b = _node(tmp_path / "a.jsonl", 0, STEPS), _node(tmp_path / "b.jsonl", 1, late[:5])
    traces = [[json.loads(x) for x in p.read_text().splitlines()] for p in (a, b)]
    comparison = compare_ranks(traces)
    assert [d.batch for d in comparison.divergences] == [3, 6]  # batch 3, and rank 1 ends early
    done = _cli(a, b)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "batch 3 (requests r1): tp 0 (file 1) mode=EXTEND record_point=pre_replay "
        "branch=wait_event owner=target; tp 1 (file 2) mode=EXTEND record_point=none "
        "branch=wait_stream owner=target"
    ) in done.stdout, done.stdout
    assert "batch 6: tp 0 (file 1) 6 barriers; tp 1 (file 2) 5 barriers" in done.stdout


def test_the_summary_counts_a_scheduler_per_node_where_pids_coincide(tmp_path: Path) -> None:
    a, b = _node(tmp_path / "a.jsonl", 0, STEPS), _node(tmp_path / "b.jsonl", 1, STEPS)
    done = _cli(a, b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 scheduler(s) with barriers" in done.stdout, done.stdout  # was: 1, merged by pid
    assert f"scheduler pid 100 in {a} (tp 0, pp 0): 6 barriers" in done.stdout, done.stdout
    assert f"scheduler pid 100 in {b} (tp 1, pp 0): 6 barriers" in done.stdout, done.stdout


def test_two_runs_in_one_file_are_refused_not_compared(tmp_path: Path) -> None:
    """A server restarted onto the same trace file: its ranks were compared with the first
    run's, and a false divergence reported."""
    path = tmp_path / "restart.jsonl"
    first = [_barrier(tp, n, *step) | {"pid": 100 + tp} for tp in (0, 1) for n, step in
             enumerate(STEPS[:3], 1)]  # fmt: skip
    again = [_barrier(tp, n, *step) | {"pid": 200 + tp} for tp in (0, 1) for n, step in
             enumerate(STEPS[3:], 1)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in first + again))
    done = _cli(path)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert str(path) in line and "two schedulers of rank tp 0, pp 0, dp None" in line, line
    assert "pids 100 and 200" in line and "Traceback" not in done.stderr


def test_a_field_of_the_wrong_shape_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    bad: dict[str, dict[str, Any]] = {
        "a list for a rank": {"rank": {"tp": 0, "pp": [0], "dp": None}},
        "an int for rids": {"rids": 5},
        "a plugins list of names": {
            "kind": "process",
            "pid": 1,
            "role": "x",
            "active": True,
            "plugins": ["x"],
        },  # fmt: skip
    }
    for why, change in bad.items():
        path = tmp_path / "bad.jsonl"
        records = [_barrier(0, 1, *STEPS[0]), _barrier(0, 2, *STEPS[1]) | change]
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        done = _cli(path)
        assert done.returncode == 2, (why, done.stdout, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert f"{path}: line 2: a " in line and "Traceback" not in done.stderr, (why, line)
    path.write_text(json.dumps(_barrier(0, 1, *STEPS[0])) + "\n" + '{"kind": ' + "9" * 5000 + "}\n")
    done = _cli(path)
    assert done.returncode == 2 and f"{path}: line 2: not JSON" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("redirect", "status", "says"),
    [
        ("> /dev/full", 2, "error: standard output: No space left on device"),
        (">&-", 2, "error: standard output is closed; redirect it to a file or /dev/null instead"),
        ("| head -c 1 > /dev/null", 141, None),
    ],
)
def test_the_command_with_its_output_full_closed_or_its_reader_gone(
    tmp_path: Path, redirect: str, status: int, says: str | None
) -> None:
    """As warcore's own commands: one line naming this command and exit 2, or quietly 141
    when the reader left; never a traceback (the summary of two long traces, some 100 lines)."""
    steps = STEPS * 2000
    late = [("DECODE", "none", "wait_stream")] * len(steps)  # every other batch differs
    a, b = _node(tmp_path / "a.jsonl", 0, steps), _node(tmp_path / "b.jsonl", 1, late)
    script = f'set -o pipefail; "$@" --json {a} {b} {redirect}'
    done = subprocess.run(
        ["bash", "-c", script, "bash", sys.executable, "-m", "warcore_sglang.audit.trace"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines == ([f"python -m warcore_sglang.audit.trace: {says}"] if says else []), lines
