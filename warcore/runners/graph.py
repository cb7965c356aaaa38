"""The graph runner: one captured graph per batch-size bucket, with a planted read-done node.

Mirrors sglang's decode CUDA-graph runner: capture plants an external event-record node right
after the in-graph init (warm-up runs share the body but plant nothing); a replay records where
the decision says. Without a planted node, ``IN_REPLAY`` falls back to after the replay.

The node's event is either *persistent* (one external event per graph runner: every replay's
node re-arms it, sglang 0.5.23's) or a *ring of captured nodes*: ``node_ring_depth`` graphs per
bucket, each captured with its own external event, replay ``i`` running slot ``i mod depth``, so
a record is re-armed only ``depth`` replays later and a consumer that waits after the next
replay still binds to its own forward's record. Persistent is the ring of depth 1.

With a probe installed (:meth:`GraphRunner.capture_probe_graphs`), each bucket with a planted
node gets a second *probe graph* per slot whose probe work sits right after the node, so an
audit tool acts at exactly the in-graph record point on every replay (the sanitizer graph).
"""

from __future__ import annotations

import bisect

from warcore.batch import StaticBatch, StepInput
from warcore.core import Execution, ForwardMode, RecordPoint
from warcore.device import Event, Graph, check_ring_depth
from warcore.runners._runner import ModelRunner, StepOutput

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
        node_ring_depth: int = 1,
        node_ring_needed: int = 1,
    ) -> None:
        """``node_ring_depth``: graphs (and in-graph events) per bucket, 1 for the persistent
        event; one below ``node_ring_needed`` (the records in flight) is refused before any
        capture, naming the runner and the mode."""
        check_ring_depth(
            node_ring_depth,
            node_ring_needed,
            f"runner {runner.name!r} {mode.name} graphs",
            "in-graph event ring",
        )
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
        # Without a node there is nothing to re-arm: one graph per bucket whatever the depth.
        self.depth = node_ring_depth if plant_node else 1
        # Slot k's event is recorded only by the graphs of slot k: with depth 1 it is the one
        # persistent event (each replay's node re-arms it, and a wait issued right after a
        # replay binds to that replay's node); deeper, a record is re-armed depth replays later.
        self.node_events: list[Event] = [
            runner.device.new_event(external=True) for _ in range(self.depth)
        ]
        self._replays = 0
        self.node_planted: dict[int, bool] = {}
        self.graphs: dict[int, list[Graph]] = {}
        """Per bucket, one captured graph per ring slot."""
        self.handles: dict[int, int] = {}
        """Per bucket, the decision-cache handle of its (runner, backend, mode, context,
        execution) key: a replay's decision is one dict hit on an int."""
        self.probe_graphs: dict[int, list[Graph]] = {}
        for bucket in self.buckets:
            self._capture(bucket, plant_node)

    @property
    def graph_count(self) -> int:
        """Captured graphs held (probe graphs included): buckets x depth (x 2 with a probe)."""
        return sum(len(g) for g in self.graphs.values()) + sum(
            len(g) for g in self.probe_graphs.values()
        )

    def _capture(self, bucket: int, plant_node: bool) -> None:
        r, dev = self.runner, self.runner.device
        fb = self.static.view(self.mode, bucket, self.max_q)
        dummy = StepInput(self.mode, [], [], self.max_q).padded(bucket)
        graphs: list[Graph] = []
        planted = False
        with dev.use_stream(r.forward_stream):
            r.load_batch(dummy, fb, in_capture=True)
            r.in_graph_init(fb)  # warm-up: same body, no node
            r.body(fb)
            for event in self.node_events:
                graph = dev.new_graph()
                with dev.capture(graph):
                    r.in_graph_init(fb)
                    if plant_node and dev.is_capturing():
                        event.record()
                        planted = True
                    r.body(fb)
                graphs.append(graph)
        self.graphs[bucket] = graphs
        self.node_planted[bucket] = planted
        execution = Execution.GRAPH_PLANTED if planted else Execution.GRAPH_UNPLANTED
        self.handles[bucket] = r.decision_handle(self.mode, execution)
        _ = r.decisions[self.handles[bucket]]  # resolve at capture time, not on first replay

    def capture_probe_graphs(self) -> None:
        """Capture, per bucket with a planted node and per ring slot, a graph that runs the
        runner's probe work (``probe.at_record_point(..., IN_GRAPH_NODE)``) right after the
        node; replays that record at the node use it while the probe stays installed. No
        probe: drop them."""
        r, dev = self.runner, self.runner.device
        self.probe_graphs = {}
        probe = r.probe
        if probe is None or not probe.in_graph:
            return
        for bucket in self.buckets:
            if not self.node_planted[bucket]:
                continue
            fb = self.static.view(self.mode, bucket, self.max_q)
            graphs: list[Graph] = []
            for event in self.node_events:
                graph = dev.new_graph()
                # No warm-up and no load_batch: the buffers and kernels are those of the graph
                # captured at construction; only the order of the work differs.
                with dev.use_stream(r.forward_stream), dev.capture(graph):
                    r.in_graph_init(fb)
                    event.record()
                    probe.at_record_point(r, self.mode, RecordPoint.IN_GRAPH_NODE)
                    r.body(fb)
                graphs.append(graph)
            self.probe_graphs[bucket] = graphs

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
        r, mode = self.runner, self.mode
        bucket = self.bucket_for(step.batch_size)
        fb = self.static.view(mode, bucket, self.max_q)
        decision = r.decisions[self.handles[bucket]]
        point = decision.record_point
        probe = r.start_forward(step, decision)
        slot = self._replays % self.depth
        self._replays += 1
        graph = self.graphs[bucket][slot]
        if probe is not None and point is RecordPoint.IN_GRAPH_NODE:
            graph = self._probe_graph(bucket, slot)  # its probe work sits right after the node
        r.load_batch(step.padded(bucket), fb)
        if point is RecordPoint.PRE_REPLAY:
            r.publish(point, mode, probe)
        graph.replay()
        if point is RecordPoint.IN_GRAPH_NODE:
            # The replay's node re-armed its slot's event: a wait issued before that slot is
            # replayed again binds to this forward's record (the binding audit checks it).
            r.mailbox.put(self.node_events[slot], r.forward)
        elif point is RecordPoint.POST_REPLAY:
            r.publish(point, mode, probe)
        return r.emit(step, fb, point)

    def _probe_graph(self, bucket: int, slot: int) -> Graph:
        graphs = self.probe_graphs.get(bucket)
        if graphs is None:
            raise RuntimeError(
                f"{self.mode.name} graph runner, bucket {bucket}: a probe is installed but its "
                "probe graph was never captured; install probes with RunnerGroup.set_probe"
            )
        return graphs[slot]
