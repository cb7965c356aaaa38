"""Stage, then publish (issue 20 item 4, sglang #38554 and #38169): an algorithm whose prefill
reads the shared buffers later (EAGLE's draft prompt pass) publishes the early prefill event
only for a batch its ``prefill_shared_read_stager`` staged, and that step's barrier takes the
target's event.

``trtllm_mha`` declares prefill ``PRE_REPLAY``, so its EAGLE prefills can publish early; the
sim device is the real one, and the sanitizer's verdicts are deterministic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from _support import fresh_manager
from _support.audit import TINY_MODEL

import warcore
from warcore import AlgorithmSpec, ForwardMode, RecordPoint, SharedReadBoundary
from warcore.audit.sanitizer import sanitize
from warcore.core import (
    RunnerKind,
    WarcorePluginManager,
    get_registry,
    last_shared_read_runner,
    staged_prefill_point,
)
from warcore.engine import (
    Engine,
    EngineConfig,
    RunReport,
    SchedulerConfig,
    compare_with_serial,
    synthetic_trace,
)
from warcore.engine.steps import EAGLE_STEP

# trtllm_mha (prefill PRE_REPLAY) is the backend whose EAGLE prefills can publish early.
pytestmark = pytest.mark.plugins("trtllm_mha")

SMALL: dict[str, Any] = {
    "model": TINY_MODEL,
    "scheduler": SchedulerConfig(max_running=4),
    "num_slots": 512,
}
TRACE = synthetic_trace(6, seed=1, output_len=(3, 8))
SANITIZE: dict[str, Any] = {"requests": 4, "max_running": 4, "model": TINY_MODEL}


def _draft_model(target: Any, num_draft: int, device: Any) -> Any:
    from warcore.engine.model import DraftLlama

    return DraftLlama(target.cfg, device)


class EagleWithStager:
    """An EAGLE copy (the built-in step and draft model) whose stager factory is given."""

    def __init__(self, name: str, factory: Callable[[Any], Any]) -> None:
        self.name, self.factory = name, factory

    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> list[AlgorithmSpec]:
        spec = AlgorithmSpec(
            self.name,
            "eagle",
            "test",
            drafter=_draft_model,
            step=EAGLE_STEP,
            prefill_shared_read_stager=self.factory,
        )
        return [spec]


def _run(
    algorithm: str = "eagle", pm: WarcorePluginManager | None = None, **config: Any
) -> RunReport:
    """An overlap run, compared with the serial loop's tokens."""
    cfg = EngineConfig(backend="trtllm_mha", algorithm=algorithm, **SMALL, **config)
    pm = pm or fresh_manager()
    with Engine(cfg, device="sim", pm=pm) as engine:
        report = engine.run(TRACE)
    with Engine(replace(cfg, loop="serial"), device="sim", pm=pm) as engine:
        serial = engine.run(TRACE)
    compare_with_serial(report, serial)
    assert not report.errors and report.stopped is None
    return report


def _prefill_barriers(report: RunReport) -> list[Any]:
    return [
        b
        for b in report.bindings
        if b.consumer == "barrier" and b.meant is not None and b.meant.mode == "EXTEND"
    ]


# -- the rule --------------------------------------------------------------------------------


def test_the_staged_point_is_the_early_prefill_point_only_where_staging_can_make_it() -> None:
    pre, post = SharedReadBoundary.PRE_REPLAY, SharedReadBoundary.POST_REPLAY
    kw: dict[str, Any] = {"reads_later": True, "has_stager": True, "vetoed": False}
    prefill, extend = RunnerKind.PREFILL, ForwardMode.EXTEND
    assert staged_prefill_point(prefill, extend, pre, **kw) is RecordPoint.PRE_REPLAY
    assert staged_prefill_point(prefill, extend, post, **kw) is RecordPoint.NONE
    for off in ("reads_later", "has_stager"):
        assert staged_prefill_point(prefill, extend, pre, **{**kw, off: False}) is RecordPoint.NONE
    assert staged_prefill_point(prefill, extend, pre, **{**kw, "vetoed": True}) is RecordPoint.NONE
    decode = (RunnerKind.DECODE, ForwardMode.DECODE)
    assert staged_prefill_point(*decode, pre, **kw) is RecordPoint.NONE
    assert last_shared_read_runner("draft", prefill_staged=True) == "target"
    assert last_shared_read_runner("draft", prefill_staged=False) == "draft"
    assert last_shared_read_runner(None, prefill_staged=False) is None


# -- the staged EAGLE step -------------------------------------------------------------------


def test_a_staged_eagle_prefill_publishes_early_and_its_barrier_takes_the_targets_event() -> None:
    report = _run()
    prefills = report.published[(ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)]
    assert prefills > 0 and report.published[(ForwardMode.EXTEND, RecordPoint.NONE)] == 0
    assert report.staged_prefills == prefills
    barriers = _prefill_barriers(report)
    assert len(barriers) == prefills  # every prefill step fenced finely, on the target's event
    for b in barriers:
        assert b.meant.runner == "target" and b.verdict == "bound", b
    assert report.barriers["coarse"] == 0
    assert report.matches_serial is True
    assert report.stager_problems == []


def test_the_staged_eagle_step_is_sanitized_sound() -> None:
    report = sanitize("trtllm_mha", "eagle", pm=fresh_manager(), **SANITIZE)
    assert report.sound, report.format()
    modes = {m.label: m for m in report.modes}
    extend, prompt = modes["target EXTEND"], modes["draft DRAFT_EXTEND"]
    assert set(extend.record_points) == {RecordPoint.PRE_REPLAY}
    assert extend.because == "staged:eagle"
    # The draft's prompt pass ran with the buffers poisoned, every time: it read its copy.
    assert prompt.forwards > 0 and prompt.checked == prompt.forwards


def test_staging_switched_off_publishes_no_early_prefill() -> None:
    report = _run(prefill_staging=False)
    assert report.published[(ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)] == 0
    assert report.staged_prefills == 0
    assert _prefill_barriers(report) == []
    assert report.barriers["coarse"] == report.published[(ForwardMode.EXTEND, RecordPoint.NONE)]
    assert report.matches_serial is True


# -- stagers that do not stage ---------------------------------------------------------------


def _liar(worker: Any) -> Callable[[Any], bool]:
    return lambda batch: True  # says it staged; staged nothing


def test_a_lying_stager_is_caught_by_the_sanitizer() -> None:
    pm = fresh_manager(EagleWithStager("wctest_eagle_liar", _liar))
    report = sanitize("trtllm_mha", "wctest_eagle_liar", pm=pm, **SANITIZE)
    v = report.violation
    assert v is not None, report.format()
    # The draft's prompt pass read req_to_token after the target's early record. It writes its
    # K/V and reads it back through the same poisoned slots, so its own outputs match; the
    # next draft decode reads the right slots and finds that K/V missing.
    assert (v.kind, v.runner, v.forward_mode) == ("poisoned-state", "draft", ForwardMode.DECODE)
    assert v.step == 1 and v.published_by == "target EXTEND"
    assert (v.published_mode, v.record_point) == (ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)


def test_the_honest_stager_under_another_name_is_sound() -> None:
    """The same algorithm with the engine's stager: what the liar is caught for is its lie."""
    from warcore.engine.spec import stage_draft_extend

    pm = fresh_manager(EagleWithStager("wctest_eagle_honest", stage_draft_extend))
    assert sanitize("trtllm_mha", "wctest_eagle_honest", pm=pm, **SANITIZE).sound


def _raises(worker: Any) -> Callable[[Any], bool]:
    def stager(batch: Any) -> bool:
        raise RuntimeError("no staging area")

    return stager


def _not_a_bool(worker: Any) -> Callable[[Any], Any]:
    return lambda batch: "yes"


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        (_raises, "raised {n} time(s), first RuntimeError: no staging area"),
        (_not_a_bool, "answered a non-bool {n} time(s), first answered 'yes', not a bool"),
    ],
)
def test_a_stager_that_fails_counts_as_not_staged_and_is_recorded(
    factory: Callable[[Any], Any], said: str
) -> None:
    name = "wctest_eagle_" + factory.__name__.strip("_")
    report = _run(name, fresh_manager(EagleWithStager(name, factory)))
    assert report.published[(ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)] == 0
    assert _prefill_barriers(report) == []
    prefills = report.published[(ForwardMode.EXTEND, RecordPoint.NONE)]
    [problem] = report.stager_problems  # once per run, with the count of every prefill's
    assert f"algorithm {name!r} (plugin 'EagleWithStager')" in problem
    assert said.format(n=prefills) in problem
    assert report.matches_serial is True


def _factory_raises(worker: Any) -> Callable[[Any], bool]:
    raise RuntimeError("no staging area")


def test_a_stager_factory_that_raises_is_a_plugin_failure_exit_1(
    clean_env: None, register_for_test: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the algorithm and its plugin, and exit 1 as a drafter factory's failure
    is: the plugin failed, not the command line (it was exit 2, "bad arguments")."""
    from warcore import cli
    from warcore.engine import AlgorithmFactoryError

    name = "wctest_eagle_factory_raises"
    pm = fresh_manager(EagleWithStager(name, _factory_raises))
    with pytest.raises(AlgorithmFactoryError, match="prefill_shared_read_stager factory raised"):
        Engine(EngineConfig(algorithm=name, **SMALL), device="sim", pm=pm)
    register_for_test(EagleWithStager(name, _factory_raises))
    argv = ["run", "--algorithm", name, "--requests", "1", "--device", "sim", "--no-verify"]
    assert cli.main(argv) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"algorithm {name!r} (plugin 'EagleWithStager')" in line
    assert "RuntimeError: no staging area" in line


@pytest.mark.plugins("dflash")
def test_dflash_never_calls_a_stager() -> None:
    """A step whose prefill is its own last reader needs no staging: its stager is never
    called, and its prefill's decision is unchanged by it."""
    calls: list[object] = []

    def counting(worker: Any) -> Callable[[Any], bool]:
        def stager(batch: Any) -> bool:
            calls.append(batch)
            return True

        return stager

    dflash = get_registry(fresh_manager()).algorithm("dflash")

    class DflashWithStager:
        @warcore.hookimpl
        def warcore_speculative_algorithms(self) -> list[AlgorithmSpec]:
            spec = replace(dflash, name="wctest_dflash", prefill_shared_read_stager=counting)
            return [spec]

    report = _run("wctest_dflash", fresh_manager(DflashWithStager()))
    assert calls == [] and report.staged_prefills == 0
    assert report.matches_serial is True


def test_the_read_tracer_gives_the_staged_reads_to_the_draft_prompt_pass() -> None:
    """Staged work runs before its forward begins: the tracer counts it as that forward's
    first launches, never as work after the forward that ended before it."""
    from warcore.audit.tracer import trace_reads

    trace = trace_reads("trtllm_mha", "eagle", pm=fresh_manager(), requests=4, model=TINY_MODEL)
    prompts = [f for f in trace.forwards if f.mode is ForwardMode.DRAFT_EXTEND]
    assert len(prompts) > 1  # a later prefill too: one that follows another step's forwards
    for f in prompts:
        shared = {(r.buffer, r.label) for r in f.reads if not r.host}
        assert ("req_to_token", "load_batch") in shared and (
            "req_to_token",
            "in_graph_init",
        ) in shared
        assert not any(r.after_record_point for r in f.reads)
    assert not [r for f in trace.forwards for r in f.reads if r.after_forward]


def test_the_prefill_switches_close_the_staged_point_too() -> None:
    """The prefill fast path switched off, or force-coarse: no early prefill, staged or not."""
    from warcore.core import BoundaryContext, Execution, decide

    pm = fresh_manager()
    key = (RunnerKind.PREFILL, "trtllm_mha", ForwardMode.EXTEND, BoundaryContext("eagle"))

    def staged_point() -> RecordPoint:
        decision = decide(pm, *key, Execution.EAGER)
        assert decision.record_point is RecordPoint.NONE  # unstaged: the coarse fence
        return decision.stage_point

    assert staged_point() is RecordPoint.PRE_REPLAY
    pm.set_prefill_fast_path(False)
    assert staged_point() is RecordPoint.NONE
    pm.set_prefill_fast_path(True)
    pm.set_force_coarse(True)
    assert staged_point() is RecordPoint.NONE
