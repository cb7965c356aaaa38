"""The step kinds of ``ring-step``: each a runner shape and the steps it is handed, and what
vLLM's code says about the kind where running it shows less than the code does.

Every kind runs vLLM's V2 runner (:mod:`warcore_vllm.audit._mrv2`): its ``execute_model`` for
serving steps, its ``_dummy_run`` for an idle data-parallel rank, with the ring ledger
counting and checking every slot use.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import torch

from warcore.integration import engine_code

from . import _drafter, _mrv2, _steps
from ._mrv2 import V2, Shape
from ._v2checks import STEPS, every_user_run, kind_verdict, run
from ._verdict import Verdict

__all__ = ["STEP_KINDS", "ring_step"]

DUMMY_RUNS = 4


def normal(key: str) -> Verdict:
    ring = every_user_run()
    return kind_verdict(key, ring, None, "every ring user, a new request in each step")


def _serve(v2: V2, steps: list[tuple[str, object]]) -> None:
    _mrv2.serve(v2, steps)


def pipeline_parallel(async_scheduling: bool) -> Callable[[str], Verdict]:
    def check(key: str) -> Verdict:
        shape = Shape(key, async_scheduling=async_scheduling, pipeline_parallel=2)
        ring = run(shape, lambda v2: _serve(v2, _steps.serving(STEPS)))
        extra = (
            f"max_concurrent_batches {ring.batches} (the real property), ring depth {ring.depth} "
            "(the real set_default_max_concurrency in the runner's __init__); the last PP rank, "
            "whose copy_event releases the step (non-last ranks have none: their forward feeds "
            "the last rank's, read from the code)"
        )
        return kind_verdict(key, ring, None, extra)

    return check


def _idle_rank(v2: V2) -> None:
    plan = _steps.Serving()
    _mrv2.serve(v2, [("normal step", plan.step()), ("normal step", plan.step())])
    for _ in range(DUMMY_RUNS):
        _mrv2.dummy_run(v2)
    v2.device.synchronize("end of the run")


def idle_rank(key: str) -> Verdict:
    ring = run(Shape(key), _idle_rank)
    dummy = [u for u in ring.ledger.uses if u.kind == "DP idle rank dummy run"]
    extra = (
        f"{DUMMY_RUNS} dummy runs (the real _dummy_run, as Worker.execute_dummy_batch calls it) "
        f"after 2 serving steps: {len(dummy)} slot uses in them (execute_model skips its staging "
        "when dummy_run; the default model state stages none)"
    )
    return kind_verdict(key, ring, None, extra)


def zero_token(staged: bool) -> Callable[[str], Verdict]:
    def plan(v2: V2) -> None:
        serving = _steps.Serving()
        steps = [("normal step", serving.step())]
        steps.append(("zero-token step", serving.step(tokens=False) if staged else _steps.empty()))
        steps += [("normal step", serving.step()) for _ in range(3)]
        _mrv2.serve(v2, steps)

    def check(key: str) -> Verdict:
        ring = run(Shape(key), plan)
        zero = [u for u in ring.ledger.uses if u.kind == "zero-token step"]
        what = (
            "a new request staged, no tokens scheduled: whether the scheduler emits such a "
            "step was not established"
            if staged
            else "SchedulerOutput.make_empty()"
        )
        extra = (
            f"a step that schedules no tokens ({what}) between serving steps: execute_model "
            f"returns a plain ModelRunnerOutput, no release point, after {len(zero)} slot uses "
            f"(of {', '.join(sorted({u.owner for u in zero}))})"
        )
        return kind_verdict(key, ring, None, extra)

    return check


def speculative(key: str) -> Verdict:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    order = _drafter.drafter_order(GPUModelRunner)

    def setup(v2: V2) -> None:
        v2.drafter = _drafter.drafter(order)
        v2.drafter_after_release = order.after_release

    shape = Shape(key, speculative_tokens=2)
    ring = run(shape, lambda v2: _serve(v2, _steps.serving(STEPS)), setup)
    where = "after" if order.after_release else "before"
    extra = (
        f"sample_tokens calls speculator.propose ({order.propose_line - order.release_line:+d} "
        f"lines from AsyncOutput) {where} the step's release is recorded, passing "
        f"{', '.join(order.views)}; the drafters copy them in DraftModelSpeculator."
        "_copy_request_inputs (EAGLE's, 2 tokens, run here, its reads found)"
    )
    return kind_verdict(key, ring, None, extra, late=order.after_release)


def _orders_staging(function: Callable[..., object]) -> list[str]:
    """The ``wait_stream`` calls of a conf_compute_utils function, as written."""
    node = engine_code.definition(function)
    return [
        ast.unparse(sub)
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("wait_stream")
    ]


def confidential(key: str) -> Verdict:
    import vllm.v1.conf_compute_utils as cc

    upload = _orders_staging(cc._h2d_inplace)
    register = _orders_staging(cc.register_inplace_h2d_target)
    ring = run(Shape(key, uva=False), lambda v2: _serve(v2, _steps.serving(STEPS)))
    extra = (
        "slots are vLLM's NonUvaBuffer (is_uva_available() False under CC), each use an upload "
        "into the slot's device tensor; under CC that upload lands in place on a staging stream "
        f"(_h2d_inplace orders only {'; '.join(upload)}; register_inplace_h2d_target, once per "
        f"slot: {'; '.join(register)}): nothing orders it after the slot's earlier readers but "
        "the ring depth and the engine's wait for copy_event"
    )
    return kind_verdict(key, ring, None, extra)


def _deepseek(v2: V2) -> None:
    """The DeepSeek V4.1 state as its first ``prepare_attn`` leaves it for a KV cache with a
    replay window (SWA bounded replay): ``_replay`` set (its replay kernels' warm-up, Triton,
    not run)."""
    v2.runner.model_state._replay = (64, torch.zeros(1, dtype=torch.int32))


def _dummies(v2: V2) -> None:
    for _ in range(DUMMY_RUNS):
        _mrv2.dummy_run(v2)
    v2.device.synchronize("end of the run")


def deepseek_idle(key: str) -> Verdict:
    ring = run(Shape(key, model_state="deepseek_v41"), _dummies, _deepseek)
    extra = (
        f"{DUMMY_RUNS} back-to-back dummy runs of an idle DP rank (the real _dummy_run): each "
        "calls DeepseekV41ModelState.prepare_attn, whose _upload_replay_start writes "
        "_replay_start_staging; a dummy run has no release point"
    )
    return kind_verdict(key, ring, None, extra)


def _microbatches(v2: V2) -> None:
    """``prepare_attn`` once per microbatch of the configuration (``enable_dbo``: two), as
    ``UBatchRunner.prepare`` calls it (``gpu/ubatch_utils.py``, read from the code: the
    microbatched forward cannot be built here)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.input_batch import InputBatch

    runner = v2.runner
    reqs = max(runner.req_states.num_reqs, 1)
    batch = InputBatch.make_dummy(reqs, reqs, runner.input_buffers)
    tables = runner.block_tables.get_dummy_block_tables(reqs)
    slots = runner.block_tables.get_dummy_slot_mappings(reqs)
    for _ in range(runner.parallel_config.num_ubatches):
        runner.model_state.prepare_attn(
            batch, CUDAGraphMode.NONE, tables, slots, runner.attn_groups, runner.kv_cache_config
        )


def deepseek_microbatches(key: str) -> Verdict:
    def setup(v2: V2) -> None:
        _deepseek(v2)
        v2.after_inputs = _microbatches

    shape = Shape(key, model_state="deepseek_v41", microbatches=2)
    ring = run(shape, lambda v2: _serve(v2, _steps.serving(STEPS)), setup)
    extra = (
        "dual-batch overlap (enable_dbo), 2 microbatches: DeepseekV41ModelState.prepare_attn "
        "per microbatch (real), each writing _replay_start_staging"
    )
    return kind_verdict(key, ring, None, extra)


STEP_KINDS: dict[str, Callable[[str], Verdict]] = {
    "normal step (async, PP 1)": normal,
    "PP 2, async": pipeline_parallel(True),
    "PP 2, no async (#47644's shape)": pipeline_parallel(False),
    "DP idle rank dummy run": idle_rank,
    "zero-token step": zero_token(False),
    "zero-token step with staged writes (modelled)": zero_token(True),
    "speculative decoding (drafter)": speculative,
    "Confidential Computing (NonUvaBuffer slots)": confidential,
    "DeepSeek V4.1 state: DP idle rank dummy run": deepseek_idle,
    "DeepSeek V4.1 state: 2 microbatches": deepseek_microbatches,
}
"""Step kind (as :data:`warcore_vllm.releases.STEP_KINDS` names it) -> its check."""


def ring_step(key: str) -> Verdict:
    return STEP_KINDS[key](key)
