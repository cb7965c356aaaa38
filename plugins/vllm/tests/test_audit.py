"""The audit's checks every audited release shares (the V2 ring of 0.33.0's model, the encoder
runner's ring, the scheduler's KV lifetimes) on vLLM's real classes, each shown failing with
its guard taken out of the real class in place (:mod:`warcore_vllm.audit._variants`); the command,
on the installed release and on one it has not audited."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from edits import drop_statements
from vllm_release import requires
from warcore_vllm import audit
from warcore_vllm.audit import _harness
from warcore_vllm.audit._variants import replaced, variant

SOUND, VIOLATION = audit.SOUND, audit.VIOLATION
REFUSED = "is not a release warcore-vllm has audited (audited: 0.33.0, 0.34.0, exactly)"


# -- v2-ring and encoder-ring -------------------------------------------------------------------
@requires("v2-ring")
def test_v2_ring_depth_follows_the_batch_queue() -> None:
    assert audit.v2_ring(audit.V2_DEFAULT).verdict == SOUND
    assert audit.v2_ring(audit.V2_PP).verdict == SOUND


@requires("v2-ring")
def test_v2_dummy_runs_without_release_overrun_the_ring() -> None:
    verdict = audit.v2_ring(audit.V2_DP_DUMMY)
    assert verdict.verdict == VIOLATION and "needs 4" in verdict.detail


@requires("v2-ring")
def test_v2_ring_fails_without_its_depth() -> None:
    import vllm.v1.worker.gpu.buffer_utils as buffers

    with replaced(buffers, "set_default_max_concurrency", lambda n: None):  # type: ignore[arg-type]
        verdict = audit.v2_ring(audit.V2_PP)
    assert verdict.verdict == VIOLATION and "depth 2, batch queue 3" in verdict.detail


def test_encoder_ring_sound_and_fails_without_its_semaphore_wait() -> None:
    from vllm.v1.worker.mm_encoder_model_runner import MMEncoderModelRunner as cls

    assert audit.encoder_ring().verdict == SOUND
    name = "input_tensor_semaphore"
    unguarded = variant(cls, name, drop_statements(".synchronize()"))
    with replaced(cls, name, unguarded):
        assert audit.encoder_ring().verdict == VIOLATION


# -- deferred-free and swa-settled --------------------------------------------------------------
def test_deferred_free_with_a_kv_consumer() -> None:
    verdict = audit.deferred_free(audit.KV_CONSUMER)
    assert verdict.verdict == SOUND and "defer_block_free=True" in verdict.detail
    assert audit.deferred_free(_harness.DEFAULT).verdict == audit.NOT_NEEDED


def test_deferred_free_fails_without_the_fence() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler as cls

    def free_now(node: ast.FunctionDef) -> None:
        node.body = [ast.Return(ast.Constant(True))]

    name = "_request_blocks_can_be_freed"
    with replaced(cls, name, variant(cls, name, free_now)):
        verdict = audit.deferred_free(audit.KV_CONSUMER)
    assert verdict.verdict == VIOLATION and "step 0" in verdict.detail


def test_swa_frees_on_the_settled_basis() -> None:
    assert audit.swa_settled(audit.SWA).verdict == SOUND


def test_swa_check_fails_on_the_optimistic_basis() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager as cls

    class Optimistic(ast.NodeTransformer):
        def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
            self.generic_visit(node)
            if isinstance(node.op, ast.Sub) and "num_in_flight_tokens" in ast.unparse(node.right):
                return node.left
            return node

    def change(node: ast.FunctionDef) -> None:
        Optimistic().visit(node)

    with replaced(cls, "allocate_slots", variant(cls, "allocate_slots", change)):
        verdict = audit.swa_settled(audit.SWA)
    assert verdict.verdict == VIOLATION, verdict.line()


# -- the command ---------------------------------------------------------------------------------
def test_the_audit_command(
    command: tuple[int, str, list[audit.Verdict]], capsys: pytest.CaptureFixture[str]
) -> None:
    """One verdict per (check, configuration) of the release, exit status 0 with only vLLM's
    own gaps as violations; the output goes to the session's log too."""
    from warcore_vllm.gate import current, installed_version

    status, text, verdicts = command
    with capsys.disabled():
        print("\n$ python -m warcore_vllm.audit\n" + text, end="")
    release = current()
    lines = text.splitlines()
    assert (
        lines[0]
        == f"warcore-vllm audit of vLLM {installed_version()} ({', '.join(release.staging)})"
    )
    assert [(v.check, v.key) for v in verdicts] == list(release.audits)
    assert len(lines) == len(release.audits) + 2
    violations = {(v.check, v.key) for v in verdicts if v.verdict == VIOLATION}
    assert violations == set(release.expected), text
    assert status == 0, text


def test_the_gate_accepts_the_installed_release() -> None:
    from warcore_vllm.gate import gate_problems

    assert gate_problems() == []


PRETEND = """
import importlib.metadata as md, sys
real = md.version
md.version = lambda name: "{version}" if name == "vllm" else real(name)
sys.argv = ["python -m warcore_vllm.{command}"]
from warcore_vllm import {command}
sys.exit({command}.main([]))
"""


@pytest.mark.parametrize("command", ["audit", "bench"])
def test_an_unaudited_release_is_one_line_and_exit_2(command: str) -> None:
    """On a vLLM whose version is not audited (the installed one, its version read as 0.35.0),
    ``bench`` ended in a traceback; both commands say one line naming it, exit 2, run nothing."""
    code = PRETEND.format(version="0.35.0", command=command)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "NOT AUDITED" in line]
    assert len(lines) == 1 and f"vLLM 0.35.0 {REFUSED}" in lines[0], done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "round" not in done.stdout


def test_the_tests_skip_on_an_unaudited_release_naming_it(tmp_path: Path) -> None:
    """On 0.34.0 every test erred at set-up (the harness imported the removed V1 runner); on
    a release the tests do not know, each is skipped with one reason naming it."""
    plugin = tmp_path / "pretend_vllm.py"
    plugin.write_text(
        "import importlib.metadata as md\nreal = md.version\n"
        "md.version = lambda name: '0.35.0' if name == 'vllm' else real(name)\n"
    )
    here = Path(__file__).parent
    args = ["-p", "pretend_vllm", "-q", "-rs", "-p", "no:cacheprovider", str(here / "test_gate.py")]
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    reasons = {
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("SKIPPED")
    }
    assert done.returncode == 0 and "passed" not in done.stdout, done.stdout + done.stderr
    assert len(reasons) == 1 and f"vLLM 0.35.0 {REFUSED}" in reasons.pop(), done.stdout


@pytest.mark.parametrize(
    ("command", "args", "culprit"),
    [
        ("audit", ["--bogus"], "--bogus"),
        ("bench", ["--rounds", "0"], "--rounds"),
        ("bench", ["--rounds", "1", "--base", "{missing}"], "--base"),
        ("bench", ["--json", "{folder}"], "--json"),
    ],
)
def test_the_commands_refuse_a_bad_argument_in_one_line_before_running(
    command: str, args: list[str], culprit: str, tmp_path: Path
) -> None:
    """``audit`` ignored its arguments (``--help`` ran the audit); ``bench --rounds -1`` ended
    in a traceback, and a ``--base`` that holds no package measured the installed one."""
    argv = [a.format(folder=tmp_path, missing=tmp_path / "nothing") for a in args]
    done = subprocess.run(
        [sys.executable, "-m", f"warcore_vllm.{command}", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and culprit in done.stderr.splitlines()[-1], done.stderr
    assert done.stdout == ""  # nothing was run


@pytest.mark.parametrize(
    ("module", "redirect", "says"),
    [
        (
            "warcore_vllm.audit",
            ">&-",
            "error: standard output is closed; redirect it to a file or /dev/null instead",
        ),
        ("warcore_vllm.audit", "> /dev/full", "error: standard output: No space left on device"),
        (
            "warcore_vllm.bench",
            ">&-",
            "error: standard output is closed; redirect it to a file or /dev/null instead",
        ),
    ],
)
def test_the_commands_with_their_output_closed_or_full_say_so_in_one_line(
    module: str, redirect: str, says: str
) -> None:
    """``python -m warcore_vllm.audit`` and ``.bench`` follow warcore's own commands: one line
    naming the command, exit 2, no traceback (``--help``: printed where the command runs)."""
    done = subprocess.run(
        ["bash", "-c", f'"$@" --help {redirect}', "bash", sys.executable, "-m", module],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"python -m {module}: {says}"], done.stderr
