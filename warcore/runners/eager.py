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

    def run(self, step: StepInput) -> StepOutput:
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
