"""The V1 runner's checks (vLLM 0.33.0: 0.34.0 removed Model Runner V1) on its real classes:
each verdict for the configurations vLLM guards and for those it does not, a violation once the
guard it checks is taken out of the real class in place (:mod:`warcore_vllm.audit._variants`), and
warcore's activation keeping #47644's configuration coarse."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from edits import drop_statements
from vllm_release import requires
from warcore_vllm import audit
from warcore_vllm.audit import _harness
from warcore_vllm.audit._variants import replaced, variant

SOUND, VIOLATION = audit.SOUND, audit.VIOLATION
pytestmark = requires("v1-event")


def _runner() -> Any:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


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
    unguarded = variant(cls, "synchronize_input_prep", drop_statements(".synchronize()"))
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
    from warcore_vllm import activation
    from warcore_vllm.releases import RELEASES

    from warcore.integration.post_import import PostImportFinder

    original = vars(_runner())["synchronize_input_prep"]
    table = RELEASES["0.33.0"].functions["vllm.v1.utils"]
    monkeypatch.setitem(table, "CpuGpuBuffer.copy_to_gpu", ("(self, n=None)", "0" * 16))
    with pytest.raises(activation.UnsupportedVllmError, match="code of CpuGpuBuffer.copy_to_gpu"):
        activation.install()
    assert vars(_runner())["synchronize_input_prep"] is original
    assert not activation.is_installed()
    assert not any(isinstance(f, PostImportFinder) for f in sys.meta_path)
    monkeypatch.undo()

    def broken(original: Any) -> Any:
        raise RuntimeError("no wrapper")

    monkeypatch.setattr(activation, "make_synchronize_input_prep", broken)
    with pytest.raises(activation.UnsupportedVllmError, match="patching .*RuntimeError"):
        activation.install()
    assert vars(_runner())["synchronize_input_prep"] is original
