"""The eager runner: every phase launched directly, for any mode (prefill included)."""

from __future__ import annotations

from warcore.core import DecisionKey, Execution, ForwardMode, RecordPoint, runner_kind_for
from warcore.runners._runner import ModelRunner, StepOutput
from warcore.runners.batch import StaticBatch, StepInput

__all__ = ["EagerRunner"]


class EagerRunner:
    """Runs a forward without a graph. Its record point can be the real point right after the
    in-graph init, since nothing is captured (``Execution.EAGER``)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        cfg = runner.model.cfg
        self.static = StaticBatch(
            runner.device.torch_device, runner.max_bs, runner.capacity, cfg.hidden, cfg.dtype
        )
        self._keys: dict[ForwardMode, DecisionKey] = {}

    def run(self, step: StepInput) -> StepOutput:
        r = self.runner
        mode = step.forward_mode
        key = self._keys.get(mode)
        if key is None:
            key = (
                runner_kind_for(mode, draft=r.draft),
                r.backend,
                mode,
                r.context,
                Execution.EAGER,
            )
            self._keys[mode] = key
        point = r.decisions[key].record_point
        fb = self.static.view(mode, step.batch_size, step.max_q)
        r.mailbox.put(None)
        r.load_batch(step, fb)
        if point is RecordPoint.PRE_REPLAY:
            r.publish_fresh()
        r.in_graph_init(fb)
        if point is RecordPoint.AFTER_IN_GRAPH_INIT:
            r.publish_fresh()
        r.body(fb)
        if point is RecordPoint.POST_REPLAY:
            r.publish_fresh()
        return r.emit(step, fb, point)
