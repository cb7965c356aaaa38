"""Concurrent switches and plugin-set changes.

Every run-time switch (``set_force_coarse``, ``set_prefill_fast_path``, assigning ``config``)
and every plugin-set change (``register``/``unregister``, with the generation counter) is
atomic: no update is lost, and no decision made while a declaration was in force ignores it.

The oracle is the declaration in force while a decision was made. Each switch, and each racing
plugin, has one owner thread, which publishes its state only *after* its call returned and
withdraws it *before* its next call; a decision whose lookup began and ended inside one
published state must follow it (force-coarse on: publish nothing; prefill fast path off:
prefill publishes nothing; a registered plugin's later declaration: never the earlier point;
and the other way round). A lookup that overlaps a change may see either side: not judged.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from warcore import (
    BoundaryContext,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    hookimpl,
)
from warcore.core import DecisionKey, LoaderConfig, WarcorePluginManager, get_decision_cache
from warcore.testing import make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

B, M, P = SharedReadBoundary, ForwardMode, RecordPoint
SECONDS = 3.0
"""How long the threads change things (the closing note says how often this failed before
the fix)."""
REGISTRANTS = 3
READERS = 1
PREFILL = "wctest_race_prefill"
NONE = BoundaryContext("none")


def _decode_backend(k: int) -> str:
    return f"wctest_race_{k}"


class Base:
    """Declares the decode of every racing backend ``IN_REPLAY`` and the prefill backend's
    ``EXTEND`` ``PRE_REPLAY``: the answers in force when no racing plugin is registered."""

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == PREFILL and forward_mode is M.EXTEND:
            return B.PRE_REPLAY
        if backend.startswith("wctest_race_") and forward_mode is M.DECODE:
            return B.IN_REPLAY
        return None


class Later:
    """Declares one racing backend's decode ``POST_REPLAY``: while registered, the decode must
    record after the replay (the latest answer wins), never at the in-graph node."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == self.backend and forward_mode is M.DECODE:
            return B.POST_REPLAY
        return None


def _key(kind: RunnerKind, backend: str, mode: ForwardMode) -> DecisionKey:
    execution = Execution.EAGER if kind is RunnerKind.PREFILL else Execution.GRAPH_PLANTED
    return (kind, backend, mode, NONE, execution)


def _run(threads: list[threading.Thread]) -> None:
    """Run ``threads``, handing the GIL from thread to thread every 10 µs rather than every
    5 ms, so that a thread is often interrupted in the middle of a change: where a race is,
    it shows within the test's seconds (with 5 ms, the old code lost an update in some runs
    only)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a thread hung"


Mark = tuple[bool | None, int]
"""What is in force, published as one attribute (one atomic store): the state (``None`` while
a change is under way) and how many times it was published. The count tells a lookup that saw
the same state before and after it from one that saw it change away and back in between (a
thread preempted mid-lookup while the owner turned the switch off and on again)."""


class Switch:
    """One switch, changed only by its owner thread; ``state`` is what is in force: ``True``
    or ``False`` after the call that set it returned, ``None`` while a call is under way."""

    def __init__(
        self, name: str, setter: Callable[[bool], None], getter: Callable[[], bool]
    ) -> None:
        self.name, self.setter, self.getter = name, setter, getter
        self.mark: Mark = (getter(), 0)

    @property
    def state(self) -> bool | None:
        return self.mark[0]

    def set(self, value: bool) -> list[str]:
        self.mark = (None, self.mark[1] + 1)
        self.setter(value)
        # Only this thread changes this switch: it must read what this thread just set.
        lost = [] if self.getter() is value else [f"{self.name}({value}) returned, but was lost"]
        self.mark = (value, self.mark[1] + 1)
        return lost


def _stable(switches: list[Switch], lookup: Callable[[], Any]) -> tuple[Any, tuple[Any, ...]]:
    """``lookup()``, and each switch's state if it was in force all through it (else
    ``None``): the same mark before and after, so not changed, not even away and back."""
    before = [s.mark for s in switches]
    value = lookup()
    after = [s.mark for s in switches]
    return value, tuple(b[0] if b == a else None for b, a in zip(before, after, strict=True))


class Race:
    """The declarations in force, and the judging of decisions against them."""

    def __init__(self) -> None:
        self.pm = pm = make_plugin_manager(Base())
        self.cache = get_decision_cache(pm)
        self.force = Switch("set_force_coarse", pm.set_force_coarse, lambda: pm.config.force_coarse)
        self.fast = Switch(
            "set_prefill_fast_path", pm.set_prefill_fast_path, lambda: pm.config.prefill_fast_path
        )
        self.switches = [self.force, self.fast]
        self.registered: list[Mark] = [(False, 0)] * REGISTRANTS
        self.problems: list[str] = []
        self.judged = 0
        self.changes = [0] * (len(self.switches) + REGISTRANTS)
        """Changes made, per changing thread (the switches' first)."""

    def judge_decode(self, k: int) -> None:
        handle = self.cache.handle(_key(RunnerKind.DECODE, _decode_backend(k), M.DECODE))
        before = self.registered[k]
        point, (forced, _) = _stable(self.switches, lambda: self.cache[handle].record_point)
        later = before[0] if self.registered[k] == before else None
        self.judged += 1
        what = f"{_decode_backend(k)} decode at {point.name}"
        if forced is True and point is not P.NONE:
            self.problems.append(f"force-coarse on, but {what}")
        if forced is False and later is True and point is not P.POST_REPLAY:
            self.problems.append(f"POST_REPLAY declared, but {what}")
        if forced is False and later is False and point is not P.IN_GRAPH_NODE:
            self.problems.append(f"only IN_REPLAY declared, but {what}")

    def judge_prefill(self) -> None:
        handle = self.cache.handle(_key(RunnerKind.PREFILL, PREFILL, M.EXTEND))
        point, (forced, fast) = _stable(self.switches, lambda: self.cache[handle].record_point)
        self.judged += 1
        if (forced is True or fast is False) and point is not P.NONE:
            self.problems.append(f"force-coarse {forced}, fast path {fast}: prefill at {point}")
        if forced is False and fast is True and point is not P.PRE_REPLAY:
            self.problems.append(f"fast path on, force-coarse off: prefill at {point.name}")

    def judge_all(self) -> None:
        self.judge_prefill()
        for k in range(REGISTRANTS):
            self.judge_decode(k)


def test_no_switch_or_plugin_change_is_lost_and_no_decision_ignores_one() -> None:
    """For ``SECONDS``: one thread turns force-coarse on and off, another the prefill fast
    path, three more each register and unregister a plugin of their own, all as fast as they
    can, while a reader looks decisions up. Each changing thread checks that its own change
    arrived and stayed (nobody else changes it) and judges its decisions right after its call
    returned; the reader judges its own. At the end, with nothing changing, the generation
    must have counted every change once, and the plugin set and its listing must be exact."""
    race = Race()
    pm = race.pm
    deadline = time.monotonic() + SECONDS
    errors: list[BaseException] = []
    changes = race.changes
    generation = pm.generation

    def hammer(k: int, change: Callable[[int], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                n = 0
                while time.monotonic() < deadline:
                    try:
                        change(n)
                    except Exception as exc:  # noqa: BLE001 - a change that raises: a problem
                        race.problems.append(f"{type(exc).__name__}: {exc}")
                    n += 1
                changes[k] = n
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        return run

    def switch(s: Switch) -> Callable[[int], None]:
        def change(n: int) -> None:
            race.problems.extend(s.set(not s.state))
            if n % 8 == 0:
                race.judge_all()  # decisions made right after this thread's call returned

        return change

    def registrant(k: int) -> Callable[[int], None]:
        plugin, name = Later(_decode_backend(k)), f"wctest_later_{k}"

        def change(n: int) -> None:
            race.registered[k] = (None, 2 * n + 1)
            if n % 2 == 0:
                pm.register(plugin, name=name)
            else:
                pm.unregister(name=name)
            race.registered[k] = (n % 2 == 0, 2 * n + 2)
            race.judge_decode(k)

        return change

    def reader() -> None:
        try:
            while time.monotonic() < deadline:
                race.judge_all()
                time.sleep(0.0001)  # leave the changing threads most of the time
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=hammer(k, switch(s))) for k, s in enumerate(race.switches)]
    threads += [
        threading.Thread(target=hammer(len(race.switches) + k, registrant(k)))
        for k in range(REGISTRANTS)
    ]
    threads += [threading.Thread(target=reader) for _ in range(READERS)]
    _run(threads)

    assert not errors, errors[:3]
    assert min(changes) > 10 and race.judged > 100, (changes, race.judged)
    # Nothing changes any more: every change arrived, and was counted once. The registrants
    # stopped after an even number of changes if they ended unregistered, so the listing is
    # exact for each.
    for s in race.switches:
        if s.getter() is not s.state:
            race.problems.append(f"{s.name}({s.state}) was lost")
    uncounted = sum(changes) - (pm.generation - generation)
    if uncounted:
        race.problems.append(f"{uncounted} of {sum(changes)} changes not counted")
    for k in range(REGISTRANTS):
        race.problems += _plugin_problems(pm, k, registered=changes[len(race.switches) + k] % 2)
    race.judge_all()
    kinds = sorted({re.sub(r"\d+|\(.*\)", "#", p) for p in race.problems})
    assert not race.problems, (
        f"{len(race.problems)} lost updates or decisions against what was in force, "
        f"of {sum(changes)} changes and {race.judged} decisions judged: {kinds[:6]}"
    )


def _plugin_problems(pm: WarcorePluginManager, k: int, *, registered: int) -> list[str]:
    """Racing plugin ``k`` registered (or not), listed once, its hookimpl there once (or not);
    the Base plugin's still there, once."""
    impls = [i.plugin_name for i in pm.hook.warcore_shared_read_boundary.get_hookimpls()]
    name = f"wctest_later_{k}"
    problems = []
    if impls.count("Base") != 1 or impls.count(name) != registered:
        problems.append(f"hookimpls {impls}, {name} {'' if registered else 'not '}registered")
    infos = [i.status for i in pm.plugin_infos if i.name == name]
    if infos != ["active" if registered else "disabled"]:
        problems.append(f"{name} listed as {infos}")
    return problems


class SlowToInspect(Later):
    """A plugin whose attributes take a moment to list (a lazy import, say): registering it
    leaves time between pluggy's "is the name free?" and "take the name"."""

    def __dir__(self) -> list[str]:
        time.sleep(0.001)  # releases the GIL, as the import it stands for would
        return list(super().__dir__())


def test_threads_registering_one_plugin_at_once_register_it_once() -> None:
    pm = make_plugin_manager()
    failures: list[str] = []
    for trial in range(200):
        plugin, name = SlowToInspect(f"wctest_race_{trial}"), f"wctest_once_{trial}"
        start = threading.Barrier(4)
        won: list[str | None] = []
        refused: list[BaseException] = []

        def race(
            plugin: object = plugin,
            name: str = name,
            start: Any = start,
            won: list[str | None] = won,
            refused: list[BaseException] = refused,
        ) -> None:
            start.wait()
            try:
                won.append(pm.register(plugin, name=name))
            except ValueError as exc:  # already registered: the expected answer for three
                refused.append(exc)

        _run([threading.Thread(target=race) for _ in range(4)])
        impls = [
            i for i in pm.hook.warcore_shared_read_boundary.get_hookimpls() if i.plugin_name == name
        ]
        infos = [i for i in pm.plugin_infos if i.name == name]
        if (len(won), len(refused), len(impls), len(infos)) != (1, 3, 1, 1):
            failures.append(
                f"trial {trial}: {len(won)} of 4 registered it, {len(impls)} hookimpls, "
                f"listed {len(infos)} times"
            )
    assert not failures, f"{len(failures)} of 200 trials, e.g. {failures[:3]}"


def test_assigning_the_config_is_a_switch_too() -> None:
    pm = make_plugin_manager()
    cache = get_decision_cache(pm)
    key = _key(RunnerKind.DECODE, "torch_native", M.DECODE)
    assert cache[key].record_point is P.IN_GRAPH_NODE
    generation = pm.generation
    pm.config = LoaderConfig(force_coarse=True)
    assert pm.generation == generation + 1
    assert cache[key].record_point is P.NONE  # the cached decision was dropped
    pm.config = LoaderConfig(force_coarse=True)  # no change: nothing to drop
    assert pm.generation == generation + 1
