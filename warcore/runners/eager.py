"""The eager runner: every phase launched directly, for any mode (prefill included)."""

from __future__ import annotations

import logging
from dataclasses import replace

from warcore.batch import ForwardBatch, StaticBatch, StepInput
from warcore.core import Decision, Execution, ForwardMode, RecordPoint, SharedReadBoundary
from warcore.runners._runner import ModelRunner, StepOutput

__all__ = ["EagerRunner"]

PRE = SharedReadBoundary.PRE_REPLAY


class EagerRunner:
    """Runs a forward without a graph. Its record point can be the real point right after the
    in-graph init, since nothing is captured (``Execution.EAGER``)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        cfg = runner.model.cfg
        self.static = StaticBatch(
            runner.device.torch_device, runner.max_bs, runner.capacity, cfg.hidden, cfg.dtype
        )
        self._handles: dict[ForwardMode, int] = {}
        self._staged: tuple[StepInput, ForwardBatch] | None = None

    def stage(self, step: StepInput) -> None:
        """Launch now the shared reads of ``step``'s forward, which runs later (stage, then
        publish): ``load_batch`` (its slots from ``req_to_token``) and both halves of the
        backend's metadata init, into this runner's private batch and metadata. The forward
        itself (:meth:`run` with the same step) then fills its inputs and runs its body; it
        reads the shared buffers only if its backend's layers do."""
        r = self.runner
        fb = self.static.view(step.forward_mode, step.batch_size, step.max_q)
        probe = r.probe
        if probe is not None:
            probe.begin_staging(r, step)
        r.load_batch(replace(step, fill=None), fb)
        r.in_graph_init(fb)
        if probe is not None:
            probe.end_staging(r)
        self._staged = (step, fb)

    def run(self, step: StepInput) -> StepOutput:
        staged = self._staged
        if staged is not None:
            self._staged = None
            if staged[0].rows == step.rows and staged[0].forward_mode is step.forward_mode:
                return self._run_staged(step, staged[1])
        r, mode = self.runner, step.forward_mode
        fb = self.static.view(mode, step.batch_size, step.max_q)
        decision = self._decide(step, fb)
        point = decision.record_point
        probe = r.start_forward(step, decision)
        r.load_batch(step, fb)
        if point is RecordPoint.PRE_REPLAY:
            r.publish(point, mode, probe)
        r.in_graph_init(fb)
        if point is RecordPoint.AFTER_IN_GRAPH_INIT:
            r.publish(point, mode, probe)
        r.body(fb)
        if point is RecordPoint.POST_REPLAY:
            r.publish(point, mode, probe)
        return r.emit(step, fb, point)

    def _run_staged(self, step: StepInput, fb: ForwardBatch) -> StepOutput:
        """The rest of a staged forward: its shared reads already ran (:meth:`stage`), so a
        record it is decided to make can be made before its body."""
        r, mode = self.runner, step.forward_mode
        decision = self._decide(step, fb)
        point = decision.record_point
        probe = r.start_forward(step, decision)
        r.fill_inputs(step, fb)
        if point.publishes:
            r.publish(point, mode, probe)
        r.body(fb)
        return r.emit(step, fb, point)

    def _decide(self, step: StepInput, fb: ForwardBatch) -> Decision:
        """The cached decision for the step's mode. The static declaration is the earliest a
        prefill may publish; the backend keeps it for this batch (building its snapshot) or
        withdraws it (this forward publishes nothing)."""
        r, mode = self.runner, step.forward_mode
        handle = self._handles.get(mode)
        if handle is None:
            handle = self._handles[mode] = r.decision_handle(mode, Execution.EAGER)
        decision = r.decisions[handle]
        if (
            decision.stage_point is not RecordPoint.NONE
            and r.prefill_shared_read_stager is not None
            and r.stage_prefill(replace(fb, host=step))
        ):
            # sglang #38554: the step's later shared reads are staged, so this prefill may
            # publish early (its backend is asked per batch below, as any early prefill).
            decision = replace(decision, record_point=decision.stage_point, staged=True)
        if (
            decision.record_point is RecordPoint.PRE_REPLAY
            and decision.refines_per_batch
            and _refined(r, replace(fb, host=step)) is not PRE
        ):
            return replace(decision, record_point=RecordPoint.NONE, withdrawn=True)
        return decision


def _refined(runner: ModelRunner, batch: ForwardBatch) -> object:
    """The backend's per-batch answer; a raising refinement withdraws the fast path for this
    batch (the coarse fence) and is logged once, like a failing hook."""
    try:
        return runner.backend.refine_prefill_boundary(batch)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        name = runner.backend.name
        runner.decisions.pm.log_once(
            ("failed", f"backend:{name}", "refine_prefill_boundary", error),
            logging.WARNING,
            f"backend {name!r} refine_prefill_boundary failed: {error}; this prefill publishes "
            "nothing (coarse fence)",
        )
        return None
