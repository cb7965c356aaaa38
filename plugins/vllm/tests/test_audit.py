"""Each check of the audit on vLLM 0.33.0's real classes: its verdict for the configurations
vLLM guards and for those it does not, and a violation once the guard it checks is taken out
of the real class in place (:mod:`warcore_vllm._variants`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from warcore_vllm import _harness, audit
from warcore_vllm._variants import replaced, variant

SOUND, VIOLATION = audit.SOUND, audit.VIOLATION


def _runner() -> Any:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _drop_statements(text: str) -> Any:
    """An edit removing every statement whose source contains ``text``."""

    class Drop(ast.NodeTransformer):
        def generic_visit(self, node: ast.AST) -> ast.AST:
            super().generic_visit(node)
            for field in ("body", "orelse", "finalbody"):
                stmts = getattr(node, field, None)
                if isinstance(stmts, list) and stmts:
                    kept = [s for s in stmts if text not in ast.unparse(s)]
                    setattr(node, field, kept or [ast.Pass()])
            return node

    def change(node: ast.FunctionDef) -> None:
        Drop().visit(node)

    return change


# -- v1-event --------------------------------------------------------------------------------
def test_event_exists_under_async_scheduling() -> None:
    assert audit.v1_event(_harness.DEFAULT).verdict == SOUND
    assert audit.v1_event(_harness.SYNC).verdict == audit.NOT_NEEDED


def test_pipeline_parallel_without_async_is_47644() -> None:
    verdict = audit.v1_event(_harness.PP_NO_ASYNC)
    assert verdict.verdict == VIOLATION and "#47644" in verdict.detail
    assert verdict.cls.endswith("GPUModelRunner")


def test_event_check_fails_without_the_event() -> None:
    cls = _runner()
    original = vars(cls)["__init__"]

    def init_without_event(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.prepare_inputs_event = None

    with replaced(cls, "__init__", init_without_event):
        assert audit.v1_event(_harness.DEFAULT).verdict == VIOLATION


# -- v1-guard-scope ----------------------------------------------------------------------------
def test_every_staging_write_is_inside_the_guard() -> None:
    assert audit.guard_scope(_runner()).verdict == SOUND


def test_guard_scope_fails_with_prepare_inputs_moved_out() -> None:
    cls = _runner()

    def move_out(node: ast.FunctionDef) -> None:
        for sub in ast.walk(node):
            body = getattr(sub, "body", None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.With) and "synchronize_input_prep" in ast.unparse(
                    stmt.items[0].context_expr if len(stmt.items) == 1 else stmt.items[1]
                ):
                    inner = [s for s in stmt.body if "_prepare_inputs(" in ast.unparse(s)]
                    stmt.body = [s for s in stmt.body if s not in inner] or [ast.Pass()]
                    body[i + 1 : i + 1] = inner
                    return

    with replaced(cls, "execute_model", variant(cls, "execute_model", move_out)):
        verdict = audit.guard_scope(cls)
    assert verdict.verdict == VIOLATION and "_prepare_inputs" in verdict.detail


# -- v1-host-buffers ---------------------------------------------------------------------------
def test_host_buffers_sound_with_vllms_guard() -> None:
    for cfg in (_harness.DEFAULT, _harness.SYNC):
        verdict = audit.v1_host_buffers(cfg)
        assert verdict.verdict == SOUND, verdict.line()
        assert "48 host-to-device reads" in verdict.detail


def test_host_buffers_violation_without_the_event() -> None:
    verdict = audit.v1_host_buffers(_harness.PP_NO_ASYNC)
    assert verdict.verdict == VIOLATION and "rewrote" in verdict.detail


def test_host_buffers_fail_without_the_synchronize() -> None:
    cls = _runner()
    unguarded = variant(cls, "synchronize_input_prep", _drop_statements(".synchronize()"))
    with replaced(cls, "synchronize_input_prep", unguarded):
        verdict = audit.v1_host_buffers(_harness.DEFAULT)
    assert verdict.verdict == VIOLATION, verdict.line()


@pytest.fixture
def active() -> Iterator[None]:
    from warcore_vllm import activation

    activation.install()
    try:
        yield
    finally:
        activation.uninstall()


def test_warcore_makes_47644_coarse(active: None) -> None:
    from warcore_vllm import activation

    before = activation.coarse_syncs()
    verdict = audit.v1_host_buffers(_harness.PP_NO_ASYNC)
    assert verdict.verdict == SOUND, verdict.line()
    assert activation.coarse_syncs() - before == 6  # one per step's input preparation
    before = activation.coarse_syncs()
    assert audit.v1_host_buffers(_harness.DEFAULT).verdict == SOUND
    assert activation.coarse_syncs() == before  # vLLM's own event: no coarse sync


def test_uninstall_puts_vllms_method_back() -> None:
    from warcore_vllm import activation

    cls = _runner()
    original = vars(cls)["synchronize_input_prep"]
    activation.install()
    assert vars(cls)["synchronize_input_prep"] is not original
    activation.uninstall()
    assert vars(cls)["synchronize_input_prep"] is original


def test_install_refuses_a_changed_module_and_puts_back_what_it_patched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed after vLLM imported its modules: the runner is patched first, then
    ``vllm.v1.utils`` fails its check (its audited digest differs): nothing stays patched."""
    from warcore_vllm import _names, activation

    from warcore.audit.post_import import PostImportFinder

    original = vars(_runner())["synchronize_input_prep"]
    table = _names.AUDITED["0.33.0"]["vllm.v1.utils"]
    monkeypatch.setitem(table, "CpuGpuBuffer.copy_to_gpu", ("(self, n=None)", "0" * 16))
    with pytest.raises(activation.UnsupportedVllmError, match="code of CpuGpuBuffer.copy_to_gpu"):
        activation.install()
    assert vars(_runner())["synchronize_input_prep"] is original
    assert not activation.is_installed()
    assert not any(isinstance(f, PostImportFinder) for f in sys.meta_path)
    monkeypatch.undo()

    def broken(original: Any) -> Any:
        raise RuntimeError("no wrapper")

    monkeypatch.setattr(activation, "_make", broken)
    with pytest.raises(activation.UnsupportedVllmError, match="patching .*RuntimeError"):
        activation.install()
    assert vars(_runner())["synchronize_input_prep"] is original


# -- v2-ring and encoder-ring -------------------------------------------------------------------
def test_v2_ring_depth_follows_the_batch_queue() -> None:
    assert audit.v2_ring(audit.V2_DEFAULT).verdict == SOUND
    assert audit.v2_ring(audit.V2_PP).verdict == SOUND


def test_v2_dummy_runs_without_release_overrun_the_ring() -> None:
    verdict = audit.v2_ring(audit.V2_DP_DUMMY)
    assert verdict.verdict == VIOLATION and "needs 4" in verdict.detail


def test_v2_ring_fails_without_its_depth() -> None:
    import vllm.v1.worker.gpu.buffer_utils as buffers

    with replaced(buffers, "set_default_max_concurrency", lambda n: None):  # type: ignore[arg-type]
        verdict = audit.v2_ring(audit.V2_PP)
    assert verdict.verdict == VIOLATION and "depth 2, batch queue 3" in verdict.detail


def test_encoder_ring_sound_and_fails_without_its_semaphore_wait() -> None:
    from vllm.v1.worker.mm_encoder_model_runner import MMEncoderModelRunner as cls

    assert audit.encoder_ring().verdict == SOUND
    name = "input_tensor_semaphore"
    unguarded = variant(cls, name, _drop_statements(".synchronize()"))
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
def test_the_audit_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m warcore_vllm.audit``'s ``main``: one verdict per check, exit status 0 with
    only vLLM's own open gaps as violations; its output goes to the session's log too."""
    status = audit.main([])
    out = capsys.readouterr().out
    with capsys.disabled():
        print("\n$ python -m warcore_vllm.audit\n" + out, end="")
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0] == "warcore-vllm audit of vLLM 0.33.0 (v1, v2, encoder)"
    verdicts = lines[1:-1]
    assert len(verdicts) == len(audit.CHECKS)
    violations = [v for v in verdicts if v.startswith(VIOLATION)]
    assert len(violations) == len(audit.EXPECTED)
    assert all(any(f"[{cfg}]" in v for v in violations) for _, cfg in audit.EXPECTED)


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
