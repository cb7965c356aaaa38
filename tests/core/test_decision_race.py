"""Decisions under change: no stale decision after a registration, the algorithm's
veto in every mode.

The race test is deterministic: the slow hook is held on an event, not on a sleep.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from warcore import (
    AlgorithmSpec,
    BoundaryContext,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    hookimpl,
)
from warcore.audit.matrix import build_matrix
from warcore.core import DecisionKey, decide, get_decision_cache
from warcore.testing import make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

B, M, P = SharedReadBoundary, ForwardMode, RecordPoint
KEY: DecisionKey = (
    RunnerKind.DECODE,
    "torch_native",
    M.DECODE,
    BoundaryContext(),
    Execution.GRAPH_PLANTED,
)


class HeldHook:
    """Abstains for torch_native DECODE, but only once ``release`` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == "torch_native" and forward_mode is M.DECODE:
            self.entered.set()
            assert self.release.wait(10), "the test never released the hook"
        return None


class PostReplay:
    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == "torch_native" and forward_mode is M.DECODE:
            return B.POST_REPLAY
        return None


def test_a_decision_resolved_under_an_older_plugin_set_is_never_served() -> None:
    pm = make_plugin_manager()
    held = HeldHook()
    pm.register(held, name="wctest_held")
    cache = get_decision_cache(pm)
    handle = cache.handle(KEY)  # what a runner holds from capture on
    got: list[Any] = []
    looker = threading.Thread(target=lambda: got.append(cache[handle]))
    looker.start()
    assert held.entered.wait(10)  # thread A is inside the resolution, under the old set
    pm.register(PostReplay(), name="wctest_post")  # the declaration that moves decode later
    held.release.set()
    looker.join(10)
    assert not looker.is_alive()
    fresh = decide(pm, *KEY)
    assert (fresh.record_point, fresh.source) == (P.POST_REPLAY, "plugin:wctest_post")
    # Neither the runner's next replay nor thread A itself sees the stale IN_GRAPH_NODE.
    assert cache[handle].record_point is P.POST_REPLAY
    assert got[0].record_point is P.POST_REPLAY


def test_thread_stress_lookups_and_resolutions_while_plugins_come_and_go() -> None:
    pm = make_plugin_manager()
    cache = get_decision_cache(pm)
    handle = cache.handle(KEY)
    stop = threading.Event()
    errors: list[BaseException] = []
    stale: list[str] = []
    lookups = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                point = cache[handle].record_point
                assert point in (P.IN_GRAPH_NODE, P.POST_REPLAY), point
                decide(pm, *KEY)  # a resolution racing the registrations too
                lookups[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def toggler() -> None:
        plugin = PostReplay()
        try:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                pm.register(plugin, name="wctest_post")
                # After the change returns, no lookup may serve the old decision.
                if cache[handle].record_point is not P.POST_REPLAY:
                    stale.append("registered, but IN_GRAPH_NODE was served")
                pm.unregister(name="wctest_post")
                if cache[handle].record_point is not P.IN_GRAPH_NODE:
                    stale.append("unregistered, but POST_REPLAY was served")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            stop.set()

    threads = [threading.Thread(target=reader) for _ in range(4)]
    threads.append(threading.Thread(target=toggler))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    assert not stale, stale[:3]
    assert lookups[0] > 100
    assert cache[handle] == decide(pm, *KEY)


# -- the algorithm's veto, in every mode -----------------------------------------------------


class VetoingAlgorithm:
    """An algorithm whose publish phase answer is ``answer`` in every mode."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    @hookimpl
    def warcore_speculative_algorithms(self) -> list[AlgorithmSpec]:
        return [AlgorithmSpec("wctest_quiet", "none", "never the publish phase")]

    @hookimpl
    def warcore_is_war_publish_phase(self, algorithm: str, forward_mode: ForwardMode) -> Any:
        if algorithm != "wctest_quiet":
            return None
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "source"),
    [
        (False, "phase:plugin:wctest_quiet"),
        (RuntimeError("no"), "phase:default:failed:wctest_quiet"),
    ],
)
@pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY, M.EXTEND, M.DRAFT_EXTEND_V2])
def test_a_false_or_failing_publish_phase_publishes_nothing_in_every_mode(
    answer: Any, source: str, mode: ForwardMode
) -> None:
    pm = make_plugin_manager()
    pm.register(VetoingAlgorithm(answer), name="wctest_quiet")
    for execution in Execution:
        kind = {M.EXTEND: RunnerKind.PREFILL, M.DRAFT_EXTEND_V2: RunnerKind.DRAFT_EXTEND}.get(
            mode, RunnerKind.DECODE
        )
        d = decide(pm, kind, "torch_native", mode, BoundaryContext("wctest_quiet"), execution)
        assert (d.record_point, d.source) == (P.NONE, source), (mode, execution)
    # The matrix agrees with the runner: no cell pairs publish_phase False with a record point.
    for row in build_matrix(pm):
        r = row.as_dict()
        if r["algorithm"] == "wctest_quiet":
            assert r["publish_phase"] is False and r["record_point"] == "none", r
            assert r["eager_record_point"] == "none", r


def test_the_builtins_publish_phases_keep_what_is_correct_today() -> None:
    pm = make_plugin_manager()
    ctx = BoundaryContext("none")
    for kind, mode, point in [
        (RunnerKind.DECODE, M.DECODE, P.IN_GRAPH_NODE),
        (RunnerKind.DRAFT_EXTEND, M.DRAFT_EXTEND_V2, P.NONE),  # none has no draft-extend
    ]:
        assert (
            decide(pm, kind, "torch_native", mode, ctx, Execution.GRAPH_PLANTED).record_point
            is point
        )
    eagle = BoundaryContext("eagle")
    de = decide(pm, RunnerKind.DRAFT_EXTEND, "torch_native", M.DRAFT_EXTEND_V2, eagle,
                Execution.GRAPH_PLANTED)  # fmt: skip
    assert de.record_point is P.IN_GRAPH_NODE
