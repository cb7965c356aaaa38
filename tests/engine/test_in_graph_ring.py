"""The in-graph event as a ring of captured nodes (issue 20, item 3):
``EngineConfig(in_graph_event="ring")`` captures, per bucket, one graph per ring slot, each with
its own external event node, and replay ``i`` runs slot ``i mod depth``.

sglang #31072's shape (a copy-side consumer that waits only after the next replay is launched)
binds to the next forward's record with the persistent event and to its own with the ring; the
sim device binds records and waits on the host, so each check is deterministic."""

from __future__ import annotations

import pytest
from _support.audit import TINY_MODEL

from warcore import ForwardMode, RecordPoint
from warcore.audit.bindings import audit_bindings
from warcore.batch import ForwardBatch, StepInput
from warcore.core import Decision
from warcore.device import RingTooShallow, WaitBinding
from warcore.engine import Engine, EngineConfig, RunReport, SchedulerConfig, synthetic_trace
from warcore.runners import ForwardProbe, ModelRunner

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

SMALL = {"model": TINY_MODEL, "scheduler": SchedulerConfig(max_running=4), "num_slots": 512}
TRACE = synthetic_trace(6, seed=1, output_len=(3, 8))


def _config(**options: object) -> EngineConfig:
    return EngineConfig(**SMALL, **options)  # type: ignore[arg-type]


def _run(**options: object) -> tuple[Engine, RunReport]:
    with Engine(_config(**options), device="sim") as engine:
        report = engine.run(TRACE)
    assert not report.errors and report.stopped is None
    return engine, report


def _copies(bindings: list[WaitBinding]) -> list[WaitBinding]:
    return [b for b in bindings if b.consumer == "copy"]


@pytest.mark.parametrize(("algorithm", "owner"), [("none", "target"), ("eagle", "draft")])
def test_the_31072_consumer_binds_in_time_with_the_ring_and_late_with_the_persistent_event(
    algorithm: str, owner: str
) -> None:
    _, serial = _run(algorithm=algorithm, loop="serial")
    _, persistent = _run(algorithm=algorithm, copy_wait="after-next-launch")
    [late] = audit_bindings(persistent.bindings)
    assert (late.kind, late.consumer, late.meant.runner) == ("late-binding", "copy", owner)

    engine, ring = _run(algorithm=algorithm, copy_wait="after-next-launch", in_graph_event="ring")
    published = ring.published
    assert any(point is RecordPoint.IN_GRAPH_NODE for _, point in published)  # graphs' nodes
    copies = _copies(ring.bindings)
    assert len(copies) == len(_copies(persistent.bindings)) > 0
    assert all(b.verdict == "bound" for b in copies)
    assert all(b.verdict == "bound" for b in ring.bindings)
    assert audit_bindings(ring.bindings) == []
    assert ring.outputs == serial.outputs == persistent.outputs


def test_the_ring_is_as_deep_as_the_runners_event_ring_one_graph_per_slot_and_bucket() -> None:
    with Engine(_config(copy_wait="after-next-launch", in_graph_event="ring"), device="sim") as e:
        graphs = e.target.graphs[ForwardMode.DECODE]
        assert graphs.depth == e.runner.ring.depth == 2
        assert len(set(map(id, graphs.node_events))) == 2
        assert all(len(g) == 2 for g in graphs.graphs.values())
        assert graphs.graph_count == 2 * len(graphs.buckets)
    # No consumer waits late: the derived ring is one deep, the persistent event's shape.
    with Engine(_config(in_graph_event="ring"), device="sim") as e:
        graphs = e.target.graphs[ForwardMode.DECODE]
        assert graphs.depth == 1 and graphs.graph_count == len(graphs.buckets)
    with Engine(_config(copy_wait="after-next-launch"), device="sim") as e:
        graphs = e.target.graphs[ForwardMode.DECODE]
        assert graphs.depth == 1 and graphs.graph_count == len(graphs.buckets)


def test_replays_take_the_slots_in_turn() -> None:
    """Each slot's event counts only its own replays: with two slots, n replays leave the two
    events at generations ceil(n/2) and floor(n/2) (the persistent event: at n)."""
    for in_graph_event, depth in (("ring", 2), ("persistent", 1)):
        engine, report = _run(copy_wait="after-next-launch", in_graph_event=in_graph_event)
        graphs = engine.target.graphs[ForwardMode.DECODE]
        n = report.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)]
        assert n >= 4
        records = [event.last_record() for event in graphs.node_events]
        gens = sorted(r.generation for r in records if r is not None)
        assert len(gens) == depth and gens == sorted((n + k) // depth for k in range(depth))


def test_a_ring_too_shallow_is_refused_before_capture_naming_the_runner() -> None:
    with pytest.raises(
        RingTooShallow,
        match=r"runner 'target' DECODE graphs: in-graph event ring depth 1 is too shallow; "
        r"it needs at least 2",
    ):
        Engine(
            _config(copy_wait="after-next-launch", in_graph_event="ring", event_ring_depth=1),
            device="sim",
        )
    with pytest.raises(RingTooShallow, match=r"runner 'draft' DECODE graphs: .*at least 6"):
        Engine(
            _config(
                algorithm="eagle",
                copy_wait="after-next-launch",
                in_graph_event="ring",
                event_ring_depth=5,
            ),
            device="sim",
        )


def test_an_unknown_in_graph_event_is_refused_naming_the_setting_and_the_valid_values() -> None:
    with pytest.raises(
        ValueError, match=r"unknown in_graph_event 'rings'; valid: persistent, ring"
    ):
        EngineConfig(in_graph_event="rings")  # type: ignore[arg-type]


class _NodeProbe(ForwardProbe):
    """Acts at every in-graph record point: its work, captured right after each slot's node,
    counts the replays that ran it."""

    def __init__(self) -> None:
        self.ran = 0

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        return True

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        if point is RecordPoint.IN_GRAPH_NODE:
            runner.device.launch(self._count, "probe")

    def _count(self) -> None:
        self.ran += 1

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        pass


def test_probe_graphs_are_captured_per_slot_and_keep_the_bindings_in_time() -> None:
    with Engine(_config(copy_wait="after-next-launch", in_graph_event="ring"), device="sim") as e:
        probe = _NodeProbe()
        e.target.set_probe(probe)
        graphs = e.target.graphs[ForwardMode.DECODE]
        assert all(len(g) == 2 for g in graphs.probe_graphs.values())
        assert graphs.graph_count == 4 * len(graphs.buckets)
        report = e.run(TRACE)
        e.device.synchronize()
    decodes = report.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)]
    assert probe.ran == decodes > 0  # every replay ran its slot's probe graph
    assert audit_bindings(report.bindings) == []


def test_the_sanitizer_with_the_ring_is_sound_and_reports_no_late_binding() -> None:
    """The poisoned run replays each slot's probe graph (poison right after that slot's
    node); the binding run's late copy consumer binds in time."""
    from warcore.audit.sanitizer import sanitize

    options = {"model": TINY_MODEL, "requests": 6, "copy_wait": "after-next-launch"}
    persistent = sanitize("torch_native", "none", **options)  # type: ignore[arg-type]
    assert [w.kind for w in persistent.binding_warnings] == ["late-binding"]
    ring = sanitize("torch_native", "none", in_graph_event="ring", **options)  # type: ignore[arg-type]
    assert ring.error is None and ring.sound
    assert ring.binding_findings == [] and ring.binding_warnings == []
    assert "later" not in ring.bindings and "WARNING" not in ring.format()


def test_warcore_run_takes_the_setting_and_refuses_a_bad_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warcore import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--in-graph-event", "rings"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--in-graph-event" in err and "'rings'" in err and "persistent" in err
    code = cli.main(
        ["run", "--requests", "3", "--copy-wait", "after-next-launch", "--in-graph-event", "ring"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "bindings" in out
    assert "later" not in out and "WARNING" not in out
