"""The staging-ring checks on vLLM's V2 runner (both releases where they apply): each verdict
as vLLM ships its code, and each check turned by one change to vLLM's real code in place (a
guard taken out: the verdict becomes a violation; a fix put in: a violation becomes sound)."""

from __future__ import annotations

import ast
from typing import Any

import pytest
import torch
from edits import drop_statements, duplicate_statements, insert_after
from vllm_release import requires
from warcore_vllm.audit import _kinds, _mrv2, _ring, _steps, _v2checks, _warmup
from warcore_vllm.audit._device import RecordingDevice
from warcore_vllm.audit._variants import replaced, variant
from warcore_vllm.audit._verdict import SOUND, VIOLATION
from warcore_vllm.gate import installed_version

ENTRY_POINTS = {"0.33.0": ("copy_to_uva",), "0.34.0": ("copy_to_uva", "copy_chunks_to_uva")}
"""Read from each wheel's ``UvaBufferPool`` (gpu/buffer_utils.py: 0.33.0 :88-100; 0.34.0
:113-134, both through ``_next_buf``)."""


def _buffers() -> Any:
    import vllm.v1.worker.gpu.buffer_utils as buffers

    return buffers


def _runner_module() -> Any:
    """Where ``GPUModelRunner.__init__`` finds ``set_default_max_concurrency`` (imported by
    name from buffer_utils)."""
    import vllm.v1.worker.gpu.model_runner as module

    return module


# -- ring-entry-points --------------------------------------------------------------------------
@requires("ring-entry-points")
def test_the_entry_points_are_read_from_the_pools_code() -> None:
    assert _ring.entry_points(_buffers().UvaBufferPool) == ENTRY_POINTS[str(installed_version())]
    assert _v2checks.entry_point_check().verdict == SOUND


@requires("ring-entry-points")
def test_an_entry_point_the_release_does_not_declare_is_a_violation() -> None:
    """``copy_to_gpu`` reaches the ring through ``copy_to_uva``; recompiled to advance the round
    robin itself, it is an entry point of its own, and the declared ones miss it."""
    cls = _buffers().UvaBufferPool
    code = "self._curr = (self._curr + 1) % self.max_concurrency"

    def advance(node: ast.FunctionDef) -> None:
        node.body[:0] = ast.parse(code).body

    _v2checks.every_user_run()  # cached before the variant: the check's counts are vLLM's
    with replaced(cls, "copy_to_gpu", variant(cls, "copy_to_gpu", advance)):
        assert "copy_to_gpu" in _ring.entry_points(cls)
        verdict = _v2checks.entry_point_check()
    assert verdict.verdict == VIOLATION and "copy_to_gpu" in verdict.detail


@pytest.mark.skipif(
    "copy_chunks_to_uva" not in ENTRY_POINTS.get(str(installed_version()), ()),
    reason=f"vLLM {installed_version()}'s ring has no second entry point",
)
def test_a_count_of_copy_to_uva_alone_misses_the_chunked_uses() -> None:
    """On 0.34.0 every StagedWriteTensor's contents and the fused writer's go through
    ``copy_chunks_to_uva``: a ledger of ``copy_to_uva`` alone sees none of those pools."""
    both = _v2checks.every_user_run()
    chunked = {u.pool for u in both.ledger.uses if u.entry == "copy_chunks_to_uva"}
    assert any(p.endswith("write_contents") for p in chunked)
    assert any(p.startswith("runner.block_tables.fused_writer") for p in chunked)
    shape = _v2checks.every_user_shape()
    device = RecordingDevice(sanitize=False)
    ledger = _ring.RingLedger(device, ("copy_to_uva",))
    with device.installed(), _ring.cpu_uva(), ledger.installed():
        v2 = _mrv2.build(shape, device, ledger, frozenset())
        _mrv2.serve(v2, _steps.serving(6, groups=2))
    assert not chunked & {u.pool for u in ledger.uses}
    assert len(ledger.uses) == len(both.ledger.uses) - sum(
        u.entry == "copy_chunks_to_uva" for u in both.ledger.uses
    )


# -- ring-user ---------------------------------------------------------------------------------
@requires("ring-user")
def test_every_ring_user_the_runner_holds_is_used_each_step_and_sound() -> None:
    from warcore_vllm.gate import current

    ring = _v2checks.every_user_run()
    for user in current().ring_users:
        if user.audited == "runner":
            verdict = _v2checks.ring_user(user.name, ring)
            assert verdict.verdict == SOUND, verdict.line()
            assert f"in {ring.steps} of {ring.steps} steps" in verdict.detail, verdict.line()


@requires("ring-user", "RequestState")
def test_a_ring_user_staging_a_pool_twice_a_step_is_a_violation() -> None:
    """``RequestState.apply_staged_writes`` recompiled to upload ``prompt_len`` twice (EVS's
    shape: two uses a step against a depth of 2 with 2 steps in flight)."""
    from vllm.v1.worker.gpu.states import RequestState as cls

    twice = variant(cls, "apply_staged_writes", duplicate_statements("prompt_len.copy_to_uva"))
    with replaced(cls, "apply_staged_writes", twice):
        ring = _v2checks.run(
            _v2checks.every_user_shape(), lambda v2: _mrv2.serve(v2, _steps.serving(6, groups=2))
        )
    verdict = _v2checks.ring_user("RequestState", ring)
    assert verdict.verdict == VIOLATION and "at most 2 per pool per step: needs 4" in verdict.detail
    assert "prompt_len" in verdict.detail


# -- ring-step ---------------------------------------------------------------------------------
@requires("ring-step", "PP 2, no async (#47644's shape)")
def test_a_step_whose_release_waits_for_nothing_overruns_the_ring() -> None:
    """``AsyncOutput.get_output`` recompiled without its ``copy_event.synchronize()``: the batch
    queue's wait is gone, and a slot comes round while its step's kernels may read it."""
    from vllm.v1.worker.gpu.async_utils import AsyncOutput as cls

    key = "PP 2, no async (#47644's shape)"
    assert _kinds.ring_step(key).verdict == SOUND
    unsynced = variant(cls, "get_output", drop_statements("copy_event.synchronize()"))
    with replaced(cls, "get_output", unsynced):
        assert _kinds.ring_step(key).verdict == VIOLATION
        assert _kinds.ring_step("Confidential Computing (NonUvaBuffer slots)").verdict == VIOLATION


@requires("ring-step", "PP 2, async")
def test_pipeline_parallel_overruns_a_ring_of_the_default_depth() -> None:
    """``set_default_max_concurrency`` a no-op: PP 2 with async keeps 3 steps in flight in a
    ring of 2."""
    key = "PP 2, async"
    assert _kinds.ring_step(key).verdict == SOUND
    with replaced(_runner_module(), "set_default_max_concurrency", lambda n: None):
        verdict = _kinds.ring_step(key)
    assert verdict.verdict == VIOLATION and "depth 2, batch queue 3" in verdict.detail


@requires("ring-step", "DP idle rank dummy run")
def test_a_dummy_run_that_stages_has_no_release() -> None:
    """``execute_model`` recompiled to stage in dummy runs too (its ``if not dummy_run`` made
    ``if True``): an idle rank's dummy runs then rewrite slots nothing releases."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as cls

    key = "DP idle rank dummy run"
    assert _kinds.ring_step(key).verdict == SOUND

    def change(node: ast.FunctionDef) -> None:
        first = next(
            s for s in node.body if isinstance(s, ast.If) and ast.unparse(s.test) == "not dummy_run"
        )
        first.test = ast.Constant(True)  # the staging block; later ones choose the inputs

    with replaced(cls, "execute_model", variant(cls, "execute_model", change)):
        verdict = _kinds.ring_step(key)
    assert verdict.verdict == VIOLATION and "dummy run" in verdict.detail


@requires("ring-step", "zero-token step")
def test_a_step_without_tokens_is_sound_unless_it_stages() -> None:
    assert _kinds.ring_step("zero-token step").verdict == SOUND
    verdict = _kinds.ring_step("zero-token step with staged writes (modelled)")
    assert (
        verdict.verdict == VIOLATION and "_apply_write_kernel (zero-token step)" in verdict.detail
    )


def _release_after_the_drafter(node: ast.FunctionDef) -> None:
    """``sample_tokens`` with its ``AsyncOutput(...)`` statement moved to just before its
    ``return``: the step's release then covers the drafter's reads."""
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if not isinstance(body, list):
            continue
        made = [s for s in body if isinstance(s, ast.Assign) and "AsyncOutput(" in ast.unparse(s)]
        if made:
            body.remove(made[0])
            body.insert(len(body) - 1, made[0])
            return


@requires("ring-step", "speculative decoding (drafter)")
def test_the_drafter_reads_after_the_release_and_a_later_release_fixes_it() -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as cls

    key = "speculative decoding (drafter)"
    verdict = _kinds.ring_step(key)
    assert verdict.verdict == VIOLATION and "_copy_request_inputs" in verdict.detail
    assert "sampling_states.temperature" in verdict.detail
    moved = variant(cls, "sample_tokens", _release_after_the_drafter)
    with replaced(cls, "sample_tokens", moved):
        fixed = _kinds.ring_step(key)
    assert fixed.verdict == SOUND and "before the step's release" in fixed.detail


@requires("ring-step", "DeepSeek V4.1 state: 2 microbatches")
def test_the_deepseek_state_is_sound_with_a_ring_deep_enough() -> None:
    """Its violations follow the depth: with every pool 4 deep, 2 uses a step of 2 steps in
    flight fit."""
    module = _runner_module()
    original = module.set_default_max_concurrency
    key = "DeepSeek V4.1 state: 2 microbatches"
    assert _kinds.ring_step(key).verdict == VIOLATION
    with replaced(module, "set_default_max_concurrency", lambda n: original(2 * n)):
        verdict = _kinds.ring_step(key)
    assert verdict.verdict == SOUND and "depth 4, batch queue 2" in verdict.detail


# -- warmup ------------------------------------------------------------------------------------
@requires("warmup", "run_context_prefill_warmup")
def test_the_run_step_warmups_are_sound_and_fail_without_its_synchronize() -> None:
    import vllm.v1.worker.gpu.warmup as module

    names = ("run_mixed_prefill_decode_warmup", "run_context_prefill_warmup")
    for name in names:
        assert _warmup.warmup(name).verdict == SOUND
    unsynced = variant(module, "_run_step", drop_statements("torch.accelerator.synchronize()"))
    with replaced(module, "_run_step", unsynced):
        for name in names:
            verdict = _warmup.warmup(name)
            assert verdict.verdict == VIOLATION, verdict.line()
            assert "0 device synchronizes inside" in verdict.detail


@requires("warmup", "_warmup_kernels")
def test_warmup_kernels_overruns_the_ring_and_a_synchronize_per_step_fixes_it() -> None:
    """``_warmup_kernels`` as shipped (both releases): its steps back to back, one synchronize
    at the end; recompiled with a synchronize after each ``worker_execute_model`` and
    ``worker_sample_tokens`` call (what 0.34.0's ``_run_step`` does), it is sound."""
    import vllm.v1.worker.gpu.warmup as module

    verdict = _warmup.warmup("_warmup_kernels")
    assert verdict.verdict == VIOLATION and "2 device synchronizes inside" in verdict.detail
    sync = "torch.accelerator.synchronize()"
    fixed = variant(module, "_warmup_kernels", insert_after("worker_sample_tokens(", sync))
    with replaced(module, "_warmup_kernels", fixed):
        again = _warmup.warmup("_warmup_kernels")
    assert again.verdict == SOUND, again.line()


@requires("warmup", "run_mixed_prefill_decode_warmup")
def test_the_mixed_warmup_of_each_release() -> None:
    """0.33.0 runs it back to back (a violation, found from its code); 0.34.0 through
    ``_run_step`` (sound)."""
    verdict = _warmup.warmup("run_mixed_prefill_decode_warmup")
    expected = {"0.33.0": VIOLATION, "0.34.0": SOUND}[str(installed_version())]
    assert verdict.verdict == expected, verdict.line()


# -- staged-by-reference -----------------------------------------------------------------------
@requires("staged-by-reference")
def test_a_write_to_a_staged_array_before_apply_is_found() -> None:
    """``RopeState.init_prefill_positions`` recompiled to write its staged positions after
    ``stage_write`` (``pos += 1``): the uploaded positions are no longer those staged."""
    from vllm.v1.worker.gpu.mm.rope import RopeState as cls

    verdict = _v2checks.staged_by_reference()
    assert verdict.verdict == SOUND and "by reference" in verdict.detail
    assert "rope.py:73 (18 ndarray)" in verdict.detail
    written = variant(cls, "init_prefill_positions", insert_after(".stage_write(", "pos += 1"))
    with replaced(cls, "init_prefill_positions", written):
        verdict = _v2checks.staged_by_reference()
    assert verdict.verdict == VIOLATION and "written before apply_write" in verdict.detail


@pytest.mark.parametrize("uva", [True, False])
def test_the_ledger_sees_a_slot_rewritten_under_a_read_whatever_bytes_it_writes(uva: bool) -> None:
    """Depth 2: a third upload of the same bytes lands in the first slot while its read is
    pending, with UVA slots and with NonUvaBuffer (Confidential Computing's) slots."""
    device = RecordingDevice(sanitize=False)
    ledger = _ring.RingLedger(device, _ring.entry_points(_buffers().UvaBufferPool))
    with device.installed(), _ring.cpu_uva(uva=uva) as buffers, ledger.installed():
        pool = buffers.UvaBufferPool(4, torch.int32, max_concurrency=2)
        for step in range(3):
            ledger.begin(step, "normal step")
            pool.copy_to_uva([7, 7, 7, 7])
            ledger.forward("the forward")
    assert [v.step for v in device.violations] == [0]
    assert len({u.slot for u in ledger.uses}) == 2 and len(ledger.uses) == 3
