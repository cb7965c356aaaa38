"""The graph runner: one captured graph per batch-size bucket, with a planted read-done node.

Mirrors sglang's decode CUDA-graph runner: capture plants an external event-record node right
after the in-graph init (warm-up runs share the body but plant nothing); a replay records where
the decision says. Without a planted node, ``IN_REPLAY`` falls back to after the replay.
"""

from __future__ import annotations

import bisect

from warcore.core import DecisionKey, Execution, ForwardMode, RecordPoint, runner_kind_for
from warcore.device import Graph
from warcore.runners._runner import ModelRunner, StepOutput
from warcore.runners.batch import StaticBatch, StepInput

__all__ = ["GraphRunner", "default_buckets"]


def default_buckets(max_bs: int) -> list[int]:
    buckets = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    return [b for b in buckets if b < max_bs] + [max_bs]


class GraphRunner:
    """Captured forwards of one mode with a fixed ``max_q`` (1 for decode, the block for verify)."""

    def __init__(
        self,
        runner: ModelRunner,
        mode: ForwardMode,
        max_q: int,
        buckets: list[int],
        *,
        plant_node: bool = True,
    ) -> None:
        self.runner = runner
        self.mode = mode
        self.max_q = max_q
        self.buckets = sorted(buckets)
        cfg = runner.model.cfg
        self.static = StaticBatch(
            runner.device.torch_device,
            self.buckets[-1],
            self.buckets[-1] * max_q,
            cfg.hidden,
            cfg.dtype,
        )
        # One persistent external event: each replay's node re-arms it, and a wait issued right
        # after a replay binds to that replay's node.
        self.read_done_event = runner.device.new_event(external=True)
        self.node_planted: dict[int, bool] = {}
        self.graphs: dict[int, Graph] = {}
        self.keys: dict[int, DecisionKey] = {}
        for bucket in self.buckets:
            self._capture(bucket, plant_node)

    def _capture(self, bucket: int, plant_node: bool) -> None:
        r, dev = self.runner, self.runner.device
        fb = self.static.view(self.mode, bucket, self.max_q)
        dummy = StepInput(self.mode, [], [], self.max_q).padded(bucket)
        with dev.use_stream(r.forward_stream):
            r.load_batch(dummy, fb, in_capture=True)
            r.in_graph_init(fb)  # warm-up: same body, no node
            r.body(fb)
            graph = dev.new_graph()
            planted = False
            with dev.capture(graph):
                r.in_graph_init(fb)
                if plant_node and dev.is_capturing():
                    self.read_done_event.record()
                    planted = True
                r.body(fb)
        self.graphs[bucket] = graph
        self.node_planted[bucket] = planted
        execution = Execution.GRAPH_PLANTED if planted else Execution.GRAPH_UNPLANTED
        key: DecisionKey = (
            runner_kind_for(self.mode, draft=r.draft),
            r.backend,
            self.mode,
            r.context,
            execution,
        )
        self.keys[bucket] = key
        _ = r.decisions[key]  # resolve at capture time, not on the first replay

    def bucket_for(self, batch_size: int) -> int:
        i = bisect.bisect_left(self.buckets, batch_size)
        if i == len(self.buckets):
            raise ValueError(
                f"batch of {batch_size} exceeds the largest captured bucket {self.buckets[-1]}"
            )
        return self.buckets[i]

    def can_run(self, step: StepInput) -> bool:
        return (
            step.forward_mode is self.mode
            and step.max_q == self.max_q
            and step.prompt_ids is None
            and step.batch_size <= self.buckets[-1]
        )

    def run(self, step: StepInput) -> StepOutput:
        r = self.runner
        bucket = self.bucket_for(step.batch_size)
        fb = self.static.view(self.mode, bucket, self.max_q)
        point = r.decisions[self.keys[bucket]].record_point
        r.mailbox.put(None)
        r.load_batch(step.padded(bucket), fb)
        if point is RecordPoint.PRE_REPLAY:
            r.publish_fresh()
        self.graphs[bucket].replay()
        if point is RecordPoint.IN_GRAPH_NODE:
            r.mailbox.put(self.read_done_event)
        elif point is RecordPoint.POST_REPLAY:
            r.publish_fresh()
        return r.emit(step, fb, point)
