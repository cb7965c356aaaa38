"""The reference engine on the sim device: overlap loop, fences, record points, the race."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest
from _support import fresh_manager
from _support.engine import LateReaderPlugin, dense_greedy

import warcore
from warcore import ForwardMode, RecordPoint, SharedReadBoundary
from warcore.core import LoaderConfig, UnknownNameError, WarcorePluginManager, get_plugin_manager
from warcore.engine import Engine, EngineConfig, Request, RunReport, synthetic_trace

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

TRACE = synthetic_trace(64, seed=7)


def run(config: EngineConfig, requests: list[Request] = TRACE, **kw: object) -> RunReport:
    with Engine(config, device="sim", **kw) as engine:  # type: ignore[arg-type]
        return engine.run(requests)


@cache
def serial_outputs(backend: str) -> dict[int, list[int]]:
    return run(EngineConfig(backend=backend, loop="serial")).outputs


def test_trace_is_mixed_and_reuses_rows() -> None:
    assert len(TRACE) >= 64
    assert len({len(r.prompt) for r in TRACE}) > 10
    assert len({r.max_new_tokens for r in TRACE}) > 10
    report = run(EngineConfig(loop="serial"))
    assert report.rows_reused > 20
    assert report.tokens == sum(r.max_new_tokens for r in TRACE)


@pytest.mark.parametrize("backend", ["torch_native", "trtllm_mha"])
@pytest.mark.parametrize("fence", ["fine", "coarse"])
@pytest.mark.plugins("trtllm_mha")
@pytest.mark.slow
def test_overlap_tokens_equal_serial(backend: str, fence: str) -> None:
    report = run(EngineConfig(backend=backend, fence=fence))  # type: ignore[arg-type]
    assert report.rows_reused > 20
    assert report.outputs == serial_outputs(backend)


@pytest.mark.parametrize("backend", ["torch_native", "trtllm_mha"])
@pytest.mark.plugins("trtllm_mha")
def test_serial_engine_equals_dense_reference(backend: str) -> None:
    requests = synthetic_trace(12, seed=3, output_len=(1, 12))
    with Engine(EngineConfig(backend=backend, loop="serial"), device="sim") as engine:
        report = engine.run(requests)
        for req in requests:
            expected = dense_greedy(engine.model, req.prompt, req.max_new_tokens)
            assert report.outputs[req.rid] == expected, req.rid


@pytest.mark.plugins("trtllm_mha")
def test_fine_fence_publishes_where_declared() -> None:
    trt = run(EngineConfig(backend="trtllm_mha"))
    assert (
        trt.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)]
        == trt.forwards[ForwardMode.DECODE]
    )
    assert (
        trt.published[(ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)]
        == trt.forwards[ForwardMode.EXTEND]
    )
    assert trt.barriers["fine"] == sum(trt.forwards.values())
    assert trt.barriers["coarse"] == 0

    native = run(EngineConfig(backend="torch_native"))
    assert (
        native.published[(ForwardMode.EXTEND, RecordPoint.NONE)]
        == native.forwards[ForwardMode.EXTEND]
    )
    assert native.barriers["coarse"] == native.forwards[ForwardMode.EXTEND]
    assert native.barriers["fine"] == native.forwards[ForwardMode.DECODE]


@pytest.mark.slow
def test_coarse_fence_never_waits_on_an_event() -> None:
    report = run(EngineConfig(fence="coarse"))
    assert report.barriers == {"coarse": sum(report.forwards.values())}


@pytest.mark.slow
def test_unplanted_graph_records_after_replay() -> None:
    report = run(EngineConfig(plant_node=False))
    decodes = report.forwards[ForwardMode.DECODE]
    assert report.published[(ForwardMode.DECODE, RecordPoint.POST_REPLAY)] == decodes
    assert report.outputs == serial_outputs("torch_native")


@pytest.mark.slow
def test_eager_decode_records_after_in_graph_init() -> None:
    report = run(EngineConfig(use_graphs=False))
    decodes = report.forwards[ForwardMode.DECODE]
    assert report.published[(ForwardMode.DECODE, RecordPoint.AFTER_IN_GRAPH_INIT)] == decodes
    assert report.outputs == serial_outputs("torch_native")


@pytest.mark.plugins("trtllm_mha")
@pytest.mark.slow
def test_force_coarse_publishes_nothing() -> None:
    pm = fresh_manager(config=LoaderConfig(force_coarse=True))
    report = run(EngineConfig(backend="trtllm_mha"), pm=pm)
    assert set(point for _, point in report.published) == {RecordPoint.NONE}
    assert report.barriers == {"coarse": sum(report.forwards.values())}
    assert report.outputs == serial_outputs("trtllm_mha")


def test_replays_never_call_hooks() -> None:
    calls: list[tuple[str, ForwardMode]] = []

    class Counting:
        @warcore.hookimpl
        def warcore_shared_read_boundary(
            self, backend: str, forward_mode: ForwardMode
        ) -> SharedReadBoundary | None:
            calls.append((backend, forward_mode))
            return None

    pm = fresh_manager(Counting())
    report = run(EngineConfig(), pm=pm)
    assert sum(report.forwards.values()) > 100
    # One resolution per distinct (mode, execution) key, however many forwards ran.
    assert 0 < len(calls) <= 4
    assert len(calls) == len(set(calls))


@pytest.mark.plugins("trtllm_mha")
def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="torch_native"):
        Engine(EngineConfig(backend="nope"), device="sim")
    with pytest.raises(UnknownNameError, match="eagle"):
        Engine(EngineConfig(algorithm="nope"), device="sim")
    with pytest.raises(ValueError, match="fine, coarse, none"):
        EngineConfig(fence="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sim, cuda"):
        Engine(EngineConfig(), device="tpu")


@pytest.fixture
def late_reader_pm() -> Iterator[tuple[WarcorePluginManager, LateReaderPlugin]]:
    plugin = LateReaderPlugin(SharedReadBoundary.IN_REPLAY)
    yield fresh_manager(plugin, entry_points=False), plugin


def _late_reader_serial(pm: WarcorePluginManager, requests: list[Request]) -> dict[int, list[int]]:
    return run(EngineConfig(backend="wctest_late_reader", loop="serial"), requests, pm=pm).outputs


@pytest.mark.slow
def test_the_race_is_real(late_reader_pm: tuple[WarcorePluginManager, LateReaderPlugin]) -> None:
    """Declared IN_REPLAY but read in the last layer: the fine fence lets the scheduler rewrite
    a reused row while the forward still reads it. The coarse fence and the honest POST_REPLAY
    declaration never corrupt a token."""
    pm, plugin = late_reader_pm
    requests = synthetic_trace(40, seed=11, output_len=(2, 16))
    expected = _late_reader_serial(pm, requests)
    early = EngineConfig(backend="wctest_late_reader", fence="fine")
    corrupted = 0
    for _ in range(5):
        report = run(early, requests, pm=pm)
        assert report.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)] > 0
        corrupted += report.outputs != expected
        if corrupted:
            break
    assert corrupted, "an early read-done never corrupted a token in 5 runs"

    for _ in range(3):
        assert (
            run(EngineConfig(backend="wctest_late_reader", fence="coarse"), requests, pm=pm).outputs
            == expected
        )

    plugin.decode_boundary = SharedReadBoundary.POST_REPLAY
    pm.unregister(plugin)  # re-registering invalidates the decision cache
    pm.register(plugin)
    for _ in range(3):
        report = run(early, requests, pm=pm)
        assert report.published[(ForwardMode.DECODE, RecordPoint.POST_REPLAY)] > 0
        assert report.outputs == expected


@pytest.mark.plugins("trtllm_mha")
def test_default_manager_is_used() -> None:
    report = run(EngineConfig(backend="trtllm_mha"), synthetic_trace(4, seed=1))
    assert report.tokens > 0
    assert get_plugin_manager().cached_decisions is not None
