"""Property tests: decisions are never earlier than declarations, UNKNOWN never publishes,
combining is monotone, and the sim device agrees with a reference model of CUDA ordering."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from _support import fresh_manager
from hypothesis import given, settings
from hypothesis import strategies as st

import warcore
from warcore import Execution, ForwardMode, RecordPoint, SharedReadBoundary, latest
from warcore.core import (
    LoaderConfig,
    RunnerKind,
    WarcorePluginManager,
    decide,
    record_point,
    resolve_shared_read_boundary,
)
from warcore.device import get_device

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

B = SharedReadBoundary
boundaries = st.sampled_from(list(B))
modes = st.sampled_from(list(ForwardMode))
executions = st.sampled_from(list(Execution))
kinds = st.sampled_from(list(RunnerKind))

# What one plugin does when asked: abstain, answer, raise, or answer with a wrong type.
answers = st.one_of(
    st.none(),
    boundaries,
    st.just("raise"),
    st.sampled_from(["PRE_REPLAY", 1, True]),
)


class _Answer:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    @warcore.hookimpl
    def warcore_shared_read_boundary(self, backend: str) -> object:
        if self.answer == "raise":
            raise RuntimeError("plugin bug")
        return self.answer


def _resolve(plugin_answers: list[object], mode: ForwardMode) -> warcore.BoundaryResolution:
    # Without the core's built-ins: only the generated answers exist.
    pm = WarcorePluginManager(LoaderConfig(), builtins=False)
    for i, answer in enumerate(plugin_answers):
        pm.register(_Answer(answer), name=f"p{i}")
    return resolve_shared_read_boundary("torch_native", mode, pm=pm)


@settings(max_examples=150, deadline=None)
@given(st.lists(answers, max_size=4), modes)
def test_resolution_is_the_latest_answer_and_failures_are_unknown(
    plugin_answers: list[object], mode: ForwardMode
) -> None:
    resolved = _resolve(plugin_answers, mode)
    given_boundaries = [a for a in plugin_answers if isinstance(a, B)]
    failed = any(a is not None and not isinstance(a, B) for a in plugin_answers)
    if failed:
        assert resolved.boundary is B.UNKNOWN and resolved.source.startswith("default:failed:")
    elif given_boundaries:
        assert resolved.boundary is latest(given_boundaries)
    for answer in given_boundaries:
        assert resolved.boundary >= answer  # never earlier than any plugin's declaration


@settings(max_examples=150, deadline=None)
@given(st.lists(answers, min_size=1, max_size=4), answers, modes)
def test_adding_a_declaration_never_makes_the_boundary_earlier(
    plugin_answers: list[object], extra: object, mode: ForwardMode
) -> None:
    if not any(a is not None for a in plugin_answers):
        return  # with no answer the contract default applies; declarations override defaults
    before = _resolve(plugin_answers, mode).boundary
    after = _resolve([*plugin_answers, extra], mode).boundary
    assert after >= before


@given(st.lists(boundaries, min_size=1), boundaries)
def test_latest_is_monotone(values: list[B], extra: B) -> None:
    assert latest([*values, extra]) >= latest(values)
    assert latest([*values, extra]) >= extra


@given(boundaries, executions)
def test_a_record_point_is_never_earlier_than_the_declaration(
    declared: B, execution: Execution
) -> None:
    # The decode runner in a publishing decode honours the declaration and nothing else.
    point = record_point(RunnerKind.DECODE, ForwardMode.DECODE, declared, True, execution)
    if point.publishes:
        assert point.boundary >= declared
    else:
        assert declared is B.UNKNOWN


@settings(max_examples=200, deadline=None)
@given(kinds, modes, executions, st.sampled_from(["none", "eagle"]))
def test_unknown_never_publishes_on_any_runner(
    kind: RunnerKind, mode: ForwardMode, execution: Execution, algorithm: str
) -> None:
    pm = fresh_manager(("wctest_unknown", _Answer(B.UNKNOWN)), entry_points=False)
    decision = decide(pm, kind, "torch_native", mode, warcore.BoundaryContext(algorithm), execution)
    assert decision.record_point is RecordPoint.NONE


# -- the sim device against a reference model of CUDA's ordering rules -------------------

_STREAMS = 3
_EVENTS = 2
_stream = st.integers(0, _STREAMS - 1)
_ops = st.one_of(
    st.tuples(st.just("work"), _stream, st.sampled_from([0.0, 0.002])),
    st.tuples(st.just("record"), _stream, st.integers(0, _EVENTS - 1)),
    st.tuples(st.just("wait"), _stream, st.integers(0, _EVENTS - 1)),
    st.tuples(st.just("wait_stream"), _stream, _stream),
    st.tuples(st.just("replay"), st.just(0), st.integers(1, _STREAMS - 1)),
)


class _Model:
    """CUDA's rules, on the host: a stream runs in order; a record covers everything enqueued
    on its stream so far and binds a new generation; a wait binds the latest generation at the
    host call (none recorded: no-op); ``wait_stream`` is a record on the other stream plus a
    wait; a graph's external record node binds a new generation at each replay."""

    def __init__(self) -> None:
        self.items: list[list[int]] = [[] for _ in range(_STREAMS)]
        self.preds: dict[int, set[int]] = {}
        self.pending: list[set[int]] = [set() for _ in range(_STREAMS)]
        self.bound: list[set[int] | None] = [None] * (_EVENTS + 1)  # +1: the graph's node

    def _covered(self, s: int) -> set[int]:
        items = set(self.items[s])
        for wid in self.items[s]:
            items |= self.preds[wid]
        return items

    def work(self, s: int, wid: int) -> None:
        self.preds[wid] = set(self.items[s]) | self.pending[s]
        for earlier in list(self.preds[wid]):
            self.preds[wid] |= self.preds.get(earlier, set())
        self.items[s].append(wid)

    def record(self, s: int, event: int) -> None:
        self.bound[event] = self._covered(s)

    def wait(self, s: int, event: int) -> None:
        if self.bound[event] is not None:
            self.pending[s] |= self.bound[event]  # type: ignore[operator]


@settings(max_examples=25, deadline=None)
@given(st.lists(_ops, max_size=20))
def test_sim_streams_agree_with_the_reference_model(program: list[tuple[str, int, Any]]) -> None:
    clock = itertools.count()
    spans: dict[int, tuple[int, int]] = {}

    def work(wid: int, seconds: float) -> Callable[[], None]:
        def run() -> None:
            start = next(clock)
            time.sleep(seconds)
            spans[wid] = (start, next(clock))

        return run

    model = _Model()
    node = _EVENTS  # the graph's external event, in the model's event table
    with get_device("sim") as dev:
        streams = [dev.new_stream(f"s{i}") for i in range(_STREAMS)]
        events = [dev.new_event() for _ in range(_EVENTS)]
        graph_event = dev.new_event(external=True)
        graph = dev.new_graph()
        # Replays run on stream 0 only, so they execute in the order they were launched.
        graph_work: deque[int] = deque()
        with dev.use_stream(streams[0]), dev.capture(graph):
            dev.launch(lambda: spans.__setitem__(graph_work.popleft(), _now(clock)))
            graph_event.record()
        for wid, (kind, s, arg) in enumerate(program, start=1):
            if kind == "work":
                with dev.use_stream(streams[s]):
                    dev.launch(work(wid, arg))
                model.work(s, wid)
            elif kind == "record":
                events[arg].record(streams[s])
                model.record(s, arg)
            elif kind == "wait":
                streams[s].wait_event(events[arg])
                model.wait(s, arg)
            elif kind == "wait_stream":
                streams[s].wait_stream(streams[arg])
                model.pending[s] |= model._covered(arg)
            else:  # replay: the graph's work item, then its node, re-armed; ``arg`` waits on it
                graph_work.append(wid)
                with dev.use_stream(streams[s]):
                    graph.replay()
                model.work(s, wid)
                model.record(s, node)
                streams[arg].wait_event(graph_event)
                model.wait(arg, node)
        dev.synchronize()

    for later, preds in model.preds.items():
        for earlier in preds:
            assert spans[earlier][1] <= spans[later][0], (earlier, later, program)


def _now(clock: itertools.count[int]) -> tuple[int, int]:
    t = next(clock)
    return (t, next(clock))
