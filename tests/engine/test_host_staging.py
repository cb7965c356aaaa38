"""Persistent host staging buffers: the sim device's copy semantics, the ring's guard, and the
two host-buffer hazards (a ring too shallow, an early fence on a host buffer), each shown
corrupting tokens under overlap and caught by the host-buffer sanitizer deterministically."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from _support.audit import TINY_MODEL

from warcore import BackendSpec, ForwardMode, SharedReadBoundary, hookimpl
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.host_buffers import BEFORE_COPY, sanitize_host_buffers
from warcore.audit.matrix import build_matrix
from warcore.batch import ForwardBatch, HostStaging, StagedInputs, StepInput, staging_depth
from warcore.core import RecordPoint, host_release_point
from warcore.device import Device, get_device
from warcore.engine import Engine, EngineConfig, SchedulerConfig, synthetic_trace
from warcore.testing import DeclaredBackend, make_plugin_manager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

PRE, IN, POST = (
    SharedReadBoundary.PRE_REPLAY,
    SharedReadBoundary.IN_REPLAY,
    SharedReadBoundary.POST_REPLAY,
)
TIMEOUT_S = 5.0
TRACE = synthetic_trace(12, seed=3, output_len=(2, 10))
SMALL_TRACE = synthetic_trace(4, seed=5, output_len=(2, 6))


@pytest.fixture
def dev() -> Iterator[Device]:
    device = get_device("sim")
    try:
        yield device
    finally:
        device.close()


# -- the device and the ring --------------------------------------------------------------
def test_sim_host_to_device_copy_reads_its_source_when_it_executes(dev: Device) -> None:
    stream = dev.new_stream("forward")
    gate = threading.Event()
    src = torch.tensor([1, 2, 3])
    dst = torch.zeros(3, dtype=torch.int64)
    with dev.use_stream(stream):
        dev.launch(lambda: gate.wait(TIMEOUT_S), "held")
        dev.launch(lambda: dst.copy_(src, non_blocking=True), "h2d")
    src.fill_(7)  # the host rewrites the source after enqueueing, before the copy runs
    gate.set()
    stream.synchronize()
    assert dst.tolist() == [7, 7, 7]


def test_guarded_ring_waits_for_the_slot_release_and_the_copy_sees_its_own_step(
    dev: Device,
) -> None:
    stream = dev.new_stream("forward")
    ring = HostStaging(4, 8, depth=1)
    gate = threading.Event()
    seen: list[list[int]] = []
    first = ring.stage(StepInput(ForwardMode.DECODE, [3, 5], [1, 1], 1))
    with dev.use_stream(stream):
        dev.launch(lambda: gate.wait(TIMEOUT_S), "held")
        dev.launch(lambda: seen.append(first.views()[0].tolist()), "h2d")
        first.release = stream.record_event()
    staged: list[StagedInputs] = []
    host = threading.Thread(
        target=lambda: staged.append(ring.stage(StepInput(ForwardMode.DECODE, [9], [1], 1)))
    )
    host.start()
    host.join(0.2)
    assert host.is_alive(), "staging into an unreleased slot must wait for its release"
    gate.set()
    host.join(TIMEOUT_S)
    assert not host.is_alive()
    assert seen == [[3, 5]]  # the copy read its own step, not the one staged after it
    assert ring.stalls == 1 and staged[0].views()[0].tolist() == [9]


def test_depth_is_derived_from_the_steps_in_flight() -> None:
    assert staging_depth(1) == 2
    assert staging_depth(5) == 10
    assert staging_depth(3, steps_in_flight=0) == 3
    assert staging_depth(3, after_collect=1) == 7
    with pytest.raises(ValueError, match="forwards_per_step"):
        staging_depth(0)
    with Engine(EngineConfig(algorithm="eagle", num_draft=2, model=TINY_MODEL)) as engine:
        target, draft = engine.runners
        assert target.staging.depth == 2  # one verify a step
        # Two draft decodes and a draft-extend a step, and that draft-extend runs after the
        # verify the host collects the step by.
        assert draft.staging.depth == 2 * 3 + 1


def test_eagle_at_the_derived_depth_never_waits_for_a_staging_slot() -> None:
    """The host collects a step by the target's verify; the draft-extend after it may still
    run when the step after next is staged, so a depth of 2 x forwards stalled on it."""
    trace = synthetic_trace(32, seed=0)
    with Engine(EngineConfig(algorithm="eagle", num_draft=4), device="sim") as engine:
        report = engine.run(trace)
        assert report.staging_stalls == 0, [(r.name, r.staging.depth) for r in engine.runners]


def test_host_release_point_is_the_read_done_event_only_when_it_covers_the_host_reads() -> None:
    assert host_release_point(RecordPoint.PRE_REPLAY, None) is RecordPoint.PRE_REPLAY
    assert host_release_point(RecordPoint.PRE_REPLAY, IN) is RecordPoint.NONE
    assert host_release_point(RecordPoint.POST_REPLAY, POST) is RecordPoint.POST_REPLAY
    assert host_release_point(RecordPoint.AFTER_IN_GRAPH_INIT, IN) is (
        RecordPoint.AFTER_IN_GRAPH_INIT
    )
    # The node's persistent event is re-armed by every replay: never a slot's release.
    assert host_release_point(RecordPoint.IN_GRAPH_NODE, None) is RecordPoint.NONE
    assert host_release_point(RecordPoint.NONE, None) is RecordPoint.NONE
    assert host_release_point(RecordPoint.POST_REPLAY, SharedReadBoundary.UNKNOWN) is (
        RecordPoint.NONE
    )


# -- the engine -----------------------------------------------------------------------------
def _run(pm: Any = None, **options: Any) -> tuple[dict[int, list[int]] | None, int]:
    """Outputs (``None`` if the run failed) and staging stalls."""
    config = EngineConfig(**options)
    with Engine(config, device="sim", pm=pm) as engine:
        try:
            report = engine.run(TRACE)
        except Exception:  # a raced buffer may also break the run: that is corruption too
            return None, -1
        return report.outputs, report.staging_stalls


@pytest.fixture(scope="module")
def oracle() -> dict[int, list[int]]:
    outputs, _ = _run(loop="serial")
    assert outputs is not None
    return outputs


def test_persistent_and_fresh_staging_give_the_serial_tokens(oracle: dict[int, list[int]]) -> None:
    for staging in ("ring", "fresh"):
        outputs, stalls = _run(staging=staging, schedule_work_s=0.002)
        assert outputs == oracle, staging
        assert stalls == 0, staging  # the derived depth never waits


def test_a_guarded_ring_too_shallow_waits_instead_of_corrupting(
    oracle: dict[int, list[int]],
) -> None:
    outputs, stalls = _run(staging_depth=1, schedule_work_s=0.005)
    assert outputs == oracle
    assert stalls > 0  # the guard held the host back: without it the ring would race


def test_a_depth_only_ring_too_shallow_corrupts_tokens_under_overlap(
    oracle: dict[int, list[int]],
) -> None:
    # The forward's copy waits behind the scheduler's modelled copy; the host stages the
    # next step into the only slot meanwhile. Races need a window: repeat until it shows.
    for _ in range(3):
        outputs, _ = _run(staging_depth=1, staging_guard=False, schedule_work_s=0.005)
        if outputs != oracle:
            return
    pytest.fail("a one-slot depth-only ring never corrupted the tokens")


def test_host_sanitizer_catches_a_shallow_depth_only_ring() -> None:
    config = EngineConfig(model=TINY_MODEL, staging_depth=1, staging_guard=False)
    report = sanitize_host_buffers(config, SMALL_TRACE)
    assert report.violation is not None, report.format()
    assert report.violation.released == BEFORE_COPY
    assert "host buffer" in report.format()
    deep = sanitize_host_buffers(EngineConfig(model=TINY_MODEL, staging_guard=False), SMALL_TRACE)
    assert deep.sound, deep.format()


# -- a backend whose kernels read a host buffer when they execute --------------------------
class HostGatherBackend(TorchNativeBackend):
    """TensorRT-LLM's shape: the page table is snapshotted in the out-graph init (so the
    device tables are done with before the replay: ``PRE_REPLAY``), and the layers gather the
    batch's rows of that snapshot through the staged *host* row indices, read when the layer
    executes (a ``cp.async`` gather of pinned host inputs)."""

    name = "wctest_host_gather"

    def __init__(self, pool: Any, max_bs: int, capacity: int, context: Any = None) -> None:
        super().__init__(pool, max_bs, capacity, context)
        self.snapshot = torch.zeros_like(pool.req_to_token)
        self.snapshot_swa = torch.zeros_like(pool.full_to_swa_index_mapping)
        self.staged: StagedInputs | None = None

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        self.snapshot.copy_(self.pool.req_to_token)
        self.snapshot_swa.copy_(self.pool.full_to_swa_index_mapping)
        self.staged = batch.staged

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.build_masks(batch)

    def forward(self, layer: int, q: Any, k: Any, v: Any, batch: ForwardBatch) -> Any:
        # Every layer gathers again, so the last host read comes layers after the record point.
        kv_idx, kv_idx_swa, out_loc_swa, _, _ = self.meta.views(batch.batch_size, batch.max_q)
        staged = self.staged
        rows = batch.req_pool_indices
        if staged is not None:
            host_rows = staged.rows[: batch.batch_size]
            rows = host_rows.to(rows.device, non_blocking=True)  # read now, at execution
        torch.index_select(self.snapshot, 0, rows, out=kv_idx)
        kv_idx_swa.copy_(self.snapshot_swa[kv_idx])
        out_loc_swa.copy_(self.snapshot_swa[batch.out_cache_loc])
        return super().forward(layer, q, k, v, batch)


class DeclaredHostGather(HostGatherBackend):
    name = "wctest_host_gather"
    host_reads = {ForwardMode.EXTEND: POST, ForwardMode.DECODE: POST}


def _host_gather_pm(backend: type[TorchNativeBackend]) -> Any:
    plugin = DeclaredBackend(backend, {ForwardMode.EXTEND: PRE, ForwardMode.DECODE: PRE})
    return make_plugin_manager(plugin, builtins="algorithms")


def test_an_early_fence_on_a_host_buffer_corrupts_tokens_under_overlap(
    oracle: dict[int, list[int]],
) -> None:
    pm = _host_gather_pm(HostGatherBackend)
    serial, _ = _run(pm, backend="wctest_host_gather", loop="serial")
    assert serial == oracle  # the backend computes the same attention
    # One guarded slot: the host rewrites it as soon as the read-done event (PRE_REPLAY) is
    # reached, while the layers still read it.
    for _ in range(3):
        outputs, _ = _run(pm, backend="wctest_host_gather", staging_depth=1, modelled_layer_s=0.002)
        if outputs != oracle:
            break
    else:
        pytest.fail("the early fence on the host rows never corrupted the tokens")
    declared = _host_gather_pm(DeclaredHostGather)
    outputs, _ = _run(
        declared, backend="wctest_host_gather", staging_depth=1, modelled_layer_s=0.002
    )
    assert outputs == oracle  # declared host reads: the slot waits for the forward's end


def test_host_sanitizer_catches_an_early_fence_on_a_host_buffer() -> None:
    config = EngineConfig(backend="wctest_host_gather", model=TINY_MODEL)
    report = sanitize_host_buffers(config, SMALL_TRACE, pm=_host_gather_pm(HostGatherBackend))
    assert report.violation is not None, report.format()
    v = report.violation
    assert v.released == RecordPoint.PRE_REPLAY.value and v.declared is None
    assert v.runner == "target" and "released pre_replay" in v.describe()
    declared = sanitize_host_buffers(config, SMALL_TRACE, pm=_host_gather_pm(DeclaredHostGather))
    assert declared.sound, declared.format()
    assert declared.poisoned == 0  # released at done: nothing left to poison


def test_host_sanitizer_passes_the_reference_engine() -> None:
    # Eager: decode publishes right after the in-graph init, which releases its host slot.
    config = EngineConfig(
        model=TINY_MODEL, use_graphs=False, scheduler=SchedulerConfig(max_running=2)
    )
    report = sanitize_host_buffers(config, SMALL_TRACE)
    assert report.sound, report.format()
    assert report.poisoned > 0, report.format()


# -- the read tracer ------------------------------------------------------------------------
def test_read_tracer_lists_host_buffer_reads_apart_from_the_device_tables() -> None:
    from warcore.audit.tracer import trace_reads

    native = trace_reads("torch_native", requests=2, model=TINY_MODEL)
    decode = native.mode(ForwardMode.DECODE)
    assert decode.host_reads > 0 and decode.host_last is not None
    assert decode.host_last.label == "load_batch"  # the engine's own copies
    assert decode.last is not None and not decode.last.host
    assert decode.implied is IN  # host reads do not move the device tables' boundary
    gather = trace_reads(
        "wctest_host_gather", requests=2, model=TINY_MODEL, pm=_host_gather_pm(HostGatherBackend)
    )
    last = gather.mode(ForwardMode.DECODE).host_last
    assert last is not None and last.label == f"layer{TINY_MODEL.layers - 1}", last
    assert "HostGatherBackend.forward" in gather.mode(ForwardMode.DECODE).host_summary()


# -- for integrators: declared by a plugin, shown in the matrix ------------------------------
class SpecDeclaredHostGather:
    """A plugin declaring the host read on the spec (for a backend it does not own)."""

    @hookimpl
    def warcore_attention_backends(self) -> list[BackendSpec]:
        reads = {"EXTEND": "POST_REPLAY", "DECODE": "POST_REPLAY"}
        return [BackendSpec("wctest_host_gather", HostGatherBackend, host_reads=reads)]

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: Any, forward_mode: ForwardMode, context: Any
    ) -> SharedReadBoundary | None:
        return PRE if getattr(backend, "name", backend) == "wctest_host_gather" else None


def _matrix_host(pm: Any) -> dict[str, tuple[str | None, str | None]]:
    rows = build_matrix(pm, backends=["wctest_host_gather"], algorithms=["none"])
    return {r.mode.name: (r.as_dict()["host_reads"], r.as_dict()["host_release"]) for r in rows}


def test_matrix_shows_where_each_host_slot_is_released() -> None:
    undeclared = _matrix_host(_host_gather_pm(HostGatherBackend))
    assert undeclared["DECODE"] == (None, "pre_replay")  # the early fence the sanitizer finds
    assert undeclared["MIXED"] == (None, None)  # no runner
    by_class = _matrix_host(_host_gather_pm(DeclaredHostGather))
    assert by_class["DECODE"] == ("POST_REPLAY", "none")  # released by the done event
    by_spec = _matrix_host(make_plugin_manager(SpecDeclaredHostGather(), builtins="algorithms"))
    assert by_spec["DECODE"] == by_spec["EXTEND"] == ("POST_REPLAY", "none")


def test_a_host_read_declared_on_the_spec_protects_the_slot() -> None:
    pm = make_plugin_manager(SpecDeclaredHostGather(), builtins="algorithms")
    config = EngineConfig(backend="wctest_host_gather", model=TINY_MODEL, use_graphs=True)
    report = sanitize_host_buffers(config, SMALL_TRACE, pm=pm)
    assert report.sound, report.format()  # the undeclared class is caught: see above
    with Engine(config, pm=pm) as engine:
        assert engine.runner.host_reads == {ForwardMode.EXTEND: POST, ForwardMode.DECODE: POST}


def test_backend_spec_host_reads_are_validated() -> None:
    spec = BackendSpec("wctest_x", HostGatherBackend, host_reads={"decode": "in_replay"})
    assert spec.host_read_until(ForwardMode.DECODE) is IN
    assert spec.host_read_until(ForwardMode.EXTEND) is None
    with pytest.raises(ValueError, match="'wctest_bad'.*host_reads"):
        BackendSpec("wctest_bad", HostGatherBackend, host_reads={"DECODE": "LATER"})


class NamedHostGather(HostGatherBackend):
    """The host reads in the spec's own spelling (mode and boundary names)."""

    host_reads = {"EXTEND": "POST_REPLAY", "DECODE": "post_replay"}


class MixedHostGather(HostGatherBackend):
    """Enum modes, boundary names: a run once crashed mid-way comparing a str with a boundary."""

    host_reads = {ForwardMode.EXTEND: "POST_REPLAY", ForwardMode.DECODE: POST}


@pytest.mark.parametrize("backend", [NamedHostGather, MixedHostGather])
def test_a_class_declaring_host_reads_by_name_protects_the_slot(
    backend: type[TorchNativeBackend],
) -> None:
    """Names are read as the spec field's are, never dropped: the slot waits for the done
    event (before, ``NamedHostGather``'s declaration was ignored and the slot was released at
    pre_replay, which the host sanitizer reported)."""
    pm = _host_gather_pm(backend)
    assert _matrix_host(pm)["DECODE"] == _matrix_host(pm)["EXTEND"] == ("POST_REPLAY", "none")
    config = EngineConfig(backend="wctest_host_gather", model=TINY_MODEL)
    report = sanitize_host_buffers(config, SMALL_TRACE, pm=pm)
    assert report.sound, report.format()
    with Engine(config, pm=pm) as engine:
        assert engine.runner.host_reads == {ForwardMode.EXTEND: POST, ForwardMode.DECODE: POST}


class BadHostGather(HostGatherBackend):
    host_reads = {ForwardMode.DECODE: "LATER"}


class NotAMapping(HostGatherBackend):
    host_reads = "POST_REPLAY"  # type: ignore[assignment]


@pytest.mark.parametrize(("backend", "says"), [(BadHostGather, "'LATER'"), (NotAMapping, "POST")])
def test_a_class_with_bad_host_reads_is_refused_when_offered_and_check_names_it(
    backend: type[TorchNativeBackend], says: str
) -> None:
    from warcore.audit.matrix import find_problems

    with pytest.raises(ValueError, match=rf"'wctest_host_gather'.*{backend.__name__}.host_reads"):
        BackendSpec("wctest_host_gather", backend)
    pm = _host_gather_pm(backend)
    [problem] = [p for p in find_problems(pm) if "wctest_host_gather" in p]
    assert f"{backend.__name__}.host_reads" in problem and says in problem, problem
    with pytest.raises(KeyError, match="unknown backend 'wctest_host_gather'"):
        Engine(EngineConfig(backend="wctest_host_gather", model=TINY_MODEL), pm=pm)


def test_an_instance_with_bad_host_reads_is_refused_when_the_engine_is_built() -> None:
    """A factory that is not the class itself: its backend's ``host_reads`` are read when it
    is built, by the same rule, before anything runs."""

    class Instance(HostGatherBackend):
        host_reads = {"DECODE": "LATER"}

    def factory(**kwargs: Any) -> TorchNativeBackend:
        return Instance(**kwargs)

    class Offers:
        @hookimpl
        def warcore_attention_backends(self) -> list[BackendSpec]:
            return [BackendSpec("wctest_host_gather", factory)]

    pm = make_plugin_manager(Offers(), builtins="algorithms")
    with pytest.raises(ValueError, match=r"'wctest_host_gather'.*host_reads.*'LATER'"):
        Engine(EngineConfig(backend="wctest_host_gather", model=TINY_MODEL), pm=pm)


def test_staging_options_are_validated_naming_the_value() -> None:
    with pytest.raises(ValueError, match="unknown staging 'pinned'.*ring, fresh"):
        EngineConfig(staging="pinned")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="staging_depth.*-1"):
        EngineConfig(staging_depth=-1)
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        HostStaging(4, 8, depth=0)


def test_cli_sanitize_host_buffers_finds_what_the_device_table_check_cannot(
    clean_env: None, register_for_test: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from warcore import cli

    register_for_test(
        DeclaredBackend(HostGatherBackend, {ForwardMode.EXTEND: PRE, ForwardMode.DECODE: PRE})
    )
    code = cli.main(
        ["sanitize", "--backend", "wctest_host_gather", "--requests", "3", "--host-buffers"]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    # The device tables are read before the replay, as declared: that check is sound ...
    assert any(
        line.split()[:2] == ["wctest_host_gather", "none"] and "sound" in line for line in lines
    )
    # ... the host rows the layers read are not.
    assert "VIOLATION (host buffer) target" in out and "VIOLATIONS FOUND" in out
