"""Bindings you can see (issue 20): every record of a read-done event carries the forward that
issued it, every wait says which record it bound to, and the binding audit judges them.

The sim device binds records and waits on the host, as CUDA does, so every check here is
deterministic: no race window, no repeats."""

from __future__ import annotations

import pytest
from _support.audit import TINY_MODEL

from warcore.audit.bindings import audit_bindings, binding_summary
from warcore.device import EventRing, RingTooShallow, WaitBinding, get_device
from warcore.engine import Engine, EngineConfig, SchedulerConfig, synthetic_trace
from warcore.runners import ReadDoneMailbox

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

SMALL = {"model": TINY_MODEL, "scheduler": SchedulerConfig(max_running=4), "num_slots": 512}


def _run(**config: object) -> tuple[Engine, list[WaitBinding]]:
    with Engine(EngineConfig(**SMALL, **config), device="sim") as engine:  # type: ignore[arg-type]
        report = engine.run(synthetic_trace(6, seed=1, output_len=(3, 8)))
        assert not report.errors and report.stopped is None
        return engine, report.bindings


# -- the device ------------------------------------------------------------------------------


def test_a_record_carries_the_forward_current_on_the_host_and_a_wait_returns_its_record() -> None:
    with get_device("sim") as dev:
        fwd, sched = dev.new_stream("forward"), dev.new_stream("schedule")
        ev = dev.new_event()
        assert sched.wait_event(ev) is None  # never recorded: a no-op binding nothing
        a = dev.begin_forward(1, "target", "DECODE")
        ev.record(fwd)
        b = dev.begin_forward(2, "target", "DECODE")
        assert a.seq < b.seq
        bound = sched.wait_event(ev)
        assert bound is not None and bound.forward == a and bound.generation == 1
        ev.record(fwd)
        assert sched.wait_event(ev) == ev.last_record()
        assert ev.last_record() is not None and ev.last_record().forward == b  # type: ignore[union-attr]
        dev.synchronize()


def test_a_replayed_graph_node_records_for_the_forward_that_replays_it() -> None:
    """The persistent in-graph event: each replay's node is a new record, bound at replay()
    to the forward current then, so a wait issued after the next replay binds to it."""
    with get_device("sim") as dev:
        fwd, copy = dev.new_stream("forward"), dev.new_stream("copy")
        node = dev.new_event(external=True)
        graph = dev.new_graph()
        with dev.use_stream(fwd):
            with dev.capture(graph):
                dev.launch(lambda: None, "body")
                node.record()
            n = dev.begin_forward(7, "target", "DECODE")
            graph.replay()
            meant = n
            n1 = dev.begin_forward(8, "target", "DECODE")
            graph.replay()  # replay N+1 launched before the copy-side wait (sglang #31072)
        bound = copy.wait_event(node)
        late = WaitBinding("copy", meant, bound)
        assert late.verdict == "later"
        [finding] = audit_bindings([late])
        assert finding.kind == "late-binding" and not finding.violation
        assert (finding.meant, finding.bound) == (n, n1)
        assert "step 7" in finding.describe() and "step 8" in finding.describe()
        dev.synchronize()


def test_a_wait_bound_to_an_earlier_forwards_record_is_a_violation() -> None:
    """A publisher that hands over an event its forward did not record (a stale one): the
    wait binds to the previous forward's record and may pass before this forward's reads."""
    with get_device("sim") as dev:
        fwd, sched = dev.new_stream("forward"), dev.new_stream("schedule")
        ev, box = dev.new_event(), ReadDoneMailbox()
        earlier = dev.begin_forward(1, "target", "DECODE")
        ev.record(fwd)
        meant = dev.begin_forward(2, "target", "DECODE")
        box.put(ev, meant)  # not recorded again in forward 2
        event, forward = box.take_published()
        assert event is not None and box.peek() is None
        binding = WaitBinding("barrier", forward, sched.wait_event(event))
        [finding] = audit_bindings([binding])
        assert finding.violation and finding.kind == "early-binding"
        assert (finding.meant, finding.bound) == (meant, earlier)
        assert finding.describe().startswith("VIOLATION (early-binding)")
        dev.synchronize()


# -- the reference engine --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "use_graphs", "owner", "mode"),
    [
        ("none", True, "target", "DECODE"),  # the persistent in-graph event
        ("none", False, "target", "DECODE"),  # ring events, after the eager forward
        ("eagle", True, "draft", "DRAFT_EXTEND_V2"),  # the step's last reader owns it
    ],
)
def test_every_barrier_binds_to_the_forward_it_meant(
    algorithm: str, use_graphs: bool, owner: str, mode: str
) -> None:
    engine, bindings = _run(algorithm=algorithm, use_graphs=use_graphs)
    fine = [b for b in bindings if b.consumer == "barrier"]
    assert len(fine) == engine.barriers["fine"] > 0
    assert all(b.verdict == "bound" for b in fine)
    decodes = [b for b in fine if b.meant is not None and b.meant.mode == mode]
    assert decodes and all(b.meant.runner == owner for b in decodes)  # type: ignore[union-attr]
    steps = [b.meant.step for b in fine]  # type: ignore[union-attr]
    assert steps == sorted(set(steps))  # one barrier per step, in order
    assert audit_bindings(bindings) == []


def test_the_31072_copy_consumer_binds_to_the_next_forwards_record() -> None:
    """A second consumer of the persistent in-graph event that waits only after the next
    replay is launched binds to replay N+1's record: reported deterministically, both
    forwards named, in every run alike."""
    runs = [_run(copy_wait="after-next-launch")[1] for _ in range(2)]
    findings = [audit_bindings(b) for b in runs]
    assert findings[0] == findings[1]  # deterministic: the same waits, the same forwards
    [late] = findings[0]
    assert (late.kind, late.consumer) == ("late-binding", "copy")
    assert late.bound.step == late.meant.step + 1 and late.bound.runner == late.meant.runner
    assert late.bound.seq > late.meant.seq
    text = late.describe()
    assert f"step {late.meant.step} target DECODE" in text
    assert f"step {late.bound.step} target DECODE" in text
    assert "#31072" in text
    barrier = [b for b in runs[0] if b.consumer == "barrier"]
    assert barrier and all(b.verdict == "bound" for b in barrier)  # the barrier is unharmed


def test_the_same_consumer_waiting_at_the_barrier_binds_in_time() -> None:
    _, bindings = _run(copy_wait="at-barrier")
    copies = [b for b in bindings if b.consumer == "copy"]
    assert copies and all(b.verdict == "bound" for b in copies)
    assert audit_bindings(bindings) == []
    assert "copy" in binding_summary(bindings) and "later" not in binding_summary(bindings)


def test_ring_events_keep_a_deferred_consumer_bound_and_a_shallow_ring_lets_it_slip() -> None:
    """Eager decode publishes ring events: the ring the engine derives (depth 2 for a
    consumer one step late) keeps every deferred wait on its own forward's record; the same
    engine with a one-event ring binds them to the next forward's."""
    engine, bindings = _run(copy_wait="after-next-launch", use_graphs=False)
    assert engine.runner.ring.depth == 2
    copies = [b for b in bindings if b.consumer == "copy"]
    assert copies and all(b.verdict == "bound" for b in copies)

    with Engine(
        EngineConfig(**SMALL, copy_wait="after-next-launch", use_graphs=False),  # type: ignore[arg-type]
        device="sim",
    ) as shallow:
        shallow.runner.ring = EventRing(shallow.device, 1, "runner 'target'")
        report = shallow.run(synthetic_trace(6, seed=1, output_len=(3, 8)))
    assert [f.kind for f in audit_bindings(report.bindings)] == ["late-binding"]


def test_a_too_shallow_ring_is_refused_at_start_up_naming_the_runner_and_the_depth() -> None:
    with pytest.raises(RingTooShallow, match=r"runner 'target'.*depth 1.*at least 2"):
        Engine(
            EngineConfig(**SMALL, copy_wait="after-next-launch", event_ring_depth=1),  # type: ignore[arg-type]
            device="sim",
        )
    # EAGLE's draft runner issues up to num_draft + 1 records a step (k decodes, the extend)
    with pytest.raises(RingTooShallow, match=r"runner 'draft'.*at least 6"):
        Engine(
            EngineConfig(
                **SMALL,  # type: ignore[arg-type]
                algorithm="eagle",
                copy_wait="after-next-launch",
                event_ring_depth=5,
            ),
            device="sim",
        )
    with pytest.raises(ValueError, match="event_ring_depth must be an int >= 1"):
        EngineConfig(event_ring_depth=0)
    with pytest.raises(ValueError, match="event_ring_depth must be an int or None, got True"):
        EngineConfig(event_ring_depth=True)


class _StickyMailbox(ReadDoneMailbox):
    """A mailbox that keeps an earlier forward's event: a forward that publishes nothing does
    not discard it (sglang's draft-extend runner: "UNKNOWN must discard any earlier phase's
    event"), and the barrier's take leaves it in place."""

    def put(self, event: object, forward: object = None) -> None:
        if event is not None:
            super().put(event, forward)  # type: ignore[arg-type]

    def take_published(self) -> tuple[object, object]:  # type: ignore[override]
        return self.peek_published()


def test_a_stale_event_left_for_a_forward_that_publishes_nothing_binds_early() -> None:
    """The prefill publishes nothing (torch_native declares no EXTEND boundary), but the
    decode graph's persistent event is still in the mailbox: the barrier means the prefill and
    binds to the earlier decode's record, a violation, named with both forwards."""
    with Engine(EngineConfig(**SMALL), device="sim") as engine:  # type: ignore[arg-type]
        engine.runner.mailbox = _StickyMailbox()
        trace = synthetic_trace(6, seed=1, output_len=(3, 8))
        for i, req in enumerate(trace):
            req.arrival_step = 4 * i  # prefills between decodes
        report = engine.run(trace)
    findings = audit_bindings(report.bindings)
    early = [f for f in findings if f.violation]
    assert early and early[0].consumer == "barrier"
    f = early[0]
    assert (f.meant.mode, f.bound.mode) == ("EXTEND", "DECODE")
    assert f.bound.seq < f.meant.seq
    assert f"meant step {f.meant.step} target EXTEND" in f.describe()
