"""A model runner with its eager and graph sub-runners: the one entry point a worker calls."""

from __future__ import annotations

from warcore.batch import StepInput
from warcore.core import ForwardMode
from warcore.runners._runner import ForwardProbe, ModelRunner, StepOutput
from warcore.runners.eager import EagerRunner
from warcore.runners.graph import GraphRunner, default_buckets

__all__ = ["RunnerGroup"]


class RunnerGroup:
    """Runs a step with the captured graph for its mode and width when there is one, eagerly
    otherwise (prefill always: its shapes change every step)."""

    def __init__(
        self,
        runner: ModelRunner,
        graph_modes: dict[ForwardMode, int],
        *,
        use_graphs: bool = True,
        plant_node: bool = True,
        node_ring_depth: int = 1,
        node_ring_needed: int = 1,
    ) -> None:
        """``node_ring_depth``/``node_ring_needed``: each graph runner's ring of captured
        record nodes and the depth its records in flight need (1, 1: the persistent event)."""
        self.runner = runner
        self.eager = EagerRunner(runner)
        buckets = default_buckets(runner.max_bs)
        self.graphs = (
            {
                mode: GraphRunner(
                    runner,
                    mode,
                    width,
                    buckets,
                    plant_node=plant_node,
                    node_ring_depth=node_ring_depth,
                    node_ring_needed=node_ring_needed,
                )
                for mode, width in graph_modes.items()
            }
            if use_graphs
            else {}
        )

    def set_probe(self, probe: ForwardProbe | None) -> None:
        """Install (or, with ``None``, remove) an audit probe on this group's runner, and
        capture (or drop) the probe graphs that put its work at the in-graph record point."""
        self.runner.probe = probe
        for graph in self.graphs.values():
            graph.capture_probe_graphs()

    def stage(self, step: StepInput) -> None:
        """Launch the shared reads of ``step``'s forward now; :meth:`run` with the same step
        runs the rest (an eager forward: the prompt passes that are staged never replay)."""
        r = self.runner
        with r.device.use_stream(r.forward_stream):
            self.eager.stage(step)

    def run(self, step: StepInput) -> StepOutput:
        r = self.runner
        with r.device.use_stream(r.forward_stream):
            graph = self.graphs.get(step.forward_mode)
            if graph is not None and graph.can_run(step):
                return graph.run(step)
            return self.eager.run(step)
