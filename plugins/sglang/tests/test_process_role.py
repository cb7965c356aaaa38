"""The start-up line names the process as sglang describes it: the role and ranks its runtime
context published (``sglang.srt.runtime_context.publish``), a scheduler's with the
disaggregation mode of its server arguments; before sglang published, the entry point's guess
(the sglang function that loaded the plugins) stands.

Real sglang in a child process (publishing changes the process's one runtime context), on the
installed release: the newest's session and each older audited release's run this."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warcore_sglang.serving import harness

_CHILD = r"""
import json, sys
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import ServerArgs
from warcore_sglang import _entry
from warcore_sglang.serving import harness

def load_plugins():  # where sglang's own loader would call the entry point
    return _entry.sglang_plugin()

def run_detokenizer_process():
    return load_plugins()

said = {"unpublished": _entry.startup_line(run_detokenizer_process())}
for name, mode, role, world_rank in (
    ("prefill", "prefill", "scheduler", 1),
    ("decode", "decode", "scheduler", 0),
    ("plain", "null", "scheduler", 1),
    ("dp", "null", "dp_controller", None),
):
    args = ServerArgs(**harness.cpu_engine_args(sys.argv[1], tp_size=2, disaggregation_mode=mode))
    ranks = None if world_rank is None else SpawnRanks(world_rank=world_rank, gpu_id=world_rank)
    publish(args, role=role, ranks=ranks)
    said[name] = _entry.startup_line(run_detokenizer_process())
print("SAID " + json.dumps(said))
"""


@pytest.fixture(scope="module")
def said(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if harness.missing_for_serving() is not None:
        pytest.skip(harness.missing_for_serving() or "")
    model = harness.write_tiny_model(tmp_path_factory.mktemp("model"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_SGLANG")}
    env |= harness.cpu_env()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(Path(model).parent),
        timeout=300,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("SAID ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    found: dict[str, str] = json.loads(lines[-1][5:])
    return found


def test_before_sglang_describes_the_process_the_entry_points_guess_stands(
    said: dict[str, str],
) -> None:
    assert "(detokenizer): warcore NOT active" in said["unpublished"], said


@pytest.mark.parametrize(
    ("case", "who"),
    [
        ("prefill", "(prefill scheduler, tp 1, pp 0)"),
        ("decode", "(decode scheduler, tp 0, pp 0)"),
        ("plain", "(scheduler, tp 1, pp 0)"),
        ("dp", "(dp-controller)"),
    ],
)
def test_the_line_names_the_role_and_ranks_sglang_published(
    said: dict[str, str], case: str, who: str
) -> None:
    """Called from a function named as sglang's detokenizer entry, after sglang published
    another role: the published one is named, not the caller's."""
    line = said[case]
    assert line.startswith("warcore-sglang: process "), said
    assert f" {who}: warcore NOT active" in line, said
