"""Plugins registered at run time: listed with who registered them, from code that has no
source file, and plugins whose hooks keep changing the plugin set.

* A plugin class or object defined in ``python -c``, a REPL or a notebook cell lives
  in ``__main__`` without a ``__file__``; ``inspect`` raises ``OSError`` for it. It registers,
  resolves, and is listed (``warcore plugins``) with no source path.
* A hook that registers another plugin every time it is asked never lets a decision
  settle. The decision cache retries a bounded number of times, blames that plugin (one log
  line, and ``warcore check``), and uses the coarse fence; ``warcore matrix`` and ``warcore
  run`` finish.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from _support import fresh_manager, plugin_info
from _support.fake_dists import REAL_PLUGINS, FakeDists, run_warcore

import warcore
from warcore import (
    BoundaryContext,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    StepFacts,
    hookimpl,
)
from warcore.core import BUILTIN_PLUGIN_NAME, DecisionKey, WarcorePluginManager, get_decision_cache
from warcore.testing import make_plugin_manager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

T = TypeVar("T")

# -- plugins without a source file ------------------------------------------------------------

NOTEBOOK_CELL = """
import json, warcore
from warcore import ForwardMode, SharedReadBoundary
from warcore.cli import main


class wctest_cell_plugin:  # registered as a class, as pluggy allows
    @warcore.hookimpl
    def warcore_shared_read_boundary(backend, forward_mode):
        if backend == "torch_native" and forward_mode is ForwardMode.DECODE:
            return SharedReadBoundary.POST_REPLAY
        return None


class CellObject:  # registered as an instance
    @warcore.hookimpl
    def warcore_fast_path_veto(self, forward_mode, context):
        return None


pm = warcore.get_plugin_manager()
# Assignments, not expression statements: a REPL would echo their values.
names = [pm.register(wctest_cell_plugin, name="wctest_cell_class")]
names.append(pm.register(CellObject(), name="wctest_cell_object"))
resolved = warcore.resolve_shared_read_boundary("torch_native", ForwardMode.DECODE)
print(json.dumps([resolved.boundary.name, resolved.source]))
status = main(["plugins", "--json"])
"""


_ENV = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")} | {
    "WARCORE_PLUGINS": ""  # the core's built-ins only
}


def _listed(stdout: str) -> tuple[list[str], dict[str, dict[str, object]]]:
    first, _, rest = stdout.partition("\n")
    return json.loads(first), {p["name"]: p for p in json.loads(rest)["plugins"]}


def test_a_plugin_defined_in_python_c_registers_resolves_and_is_listed_without_a_path() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK_CELL)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_ENV,
    )
    assert done.returncode == 0, done.stderr
    resolved, plugins = _listed(done.stdout)
    assert resolved == ["POST_REPLAY", "plugin:wctest_cell_class"]
    for name, hook in [
        ("wctest_cell_class", "warcore_shared_read_boundary"),
        ("wctest_cell_object", "warcore_fast_path_veto"),
    ]:
        info = plugins[name]
        assert (info["status"], info["path"], info["registered_by"]) == ("active", None, "runtime")
        assert info["hooks"] == [hook]
    # A plugin with a file still gets its path.
    assert str(plugins["warcore"]["path"]).endswith("builtin_plugin.py")


def test_a_plugin_typed_into_a_repl_registers_and_is_listed_without_a_path() -> None:
    # The interactive interpreter reads from a pipe here (-i): __main__ has no __file__.
    done = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=textwrap.dedent(NOTEBOOK_CELL) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=_ENV,
    )
    assert "Traceback" not in done.stderr, done.stderr
    resolved, plugins = _listed(done.stdout)
    assert resolved == ["POST_REPLAY", "plugin:wctest_cell_class"]
    assert plugins["wctest_cell_object"]["path"] is None


# -- a hook that registers a plugin every time it is asked ------------------------------------


class Helper:
    @hookimpl
    def warcore_fast_path_veto(self, forward_mode: ForwardMode, context: object) -> None:
        return None


class Spawner:
    """Registers a new helper plugin every time ``hook`` is asked (and abstains)."""

    def __init__(self, pm: WarcorePluginManager) -> None:
        self.pm, self.spawned = pm, 0

    def spawn(self) -> None:
        self.spawned += 1
        self.pm.register(Helper(), name=f"wctest_helper_{self.spawned}")


class BoundarySpawner(Spawner):
    @hookimpl
    def warcore_shared_read_boundary(self, backend: str) -> SharedReadBoundary | None:
        self.spawn()
        return None


class OwnerSpawner(Spawner):
    @hookimpl
    def warcore_step_event_owner(self, algorithm: str) -> str | None:
        self.spawn()
        return None


class RegistersOnce:
    """Registers a helper the first time it is asked, then declares: a plugin set that
    settles, so the answer stands."""

    def __init__(self, pm: WarcorePluginManager) -> None:
        self.pm = pm

    @hookimpl
    def warcore_shared_read_boundary(self, backend: str) -> SharedReadBoundary | None:
        if self.pm.get_plugin("wctest_helper") is None:
            self.pm.register(Helper(), name="wctest_helper")
        return SharedReadBoundary.POST_REPLAY if backend == "torch_native" else None


def _within(seconds: float, call: Callable[[], T]) -> T:
    """``call()`` on a daemon thread: an error if it does not return in ``seconds`` (the code
    before the fix resolved for ever)."""
    got: list[T] = []
    thread = threading.Thread(target=lambda: got.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert got, f"still resolving after {seconds} s"
    return got[0]


KEY: DecisionKey = (
    RunnerKind.DECODE,
    "torch_native",
    ForwardMode.DECODE,
    BoundaryContext(),
    Execution.GRAPH_PLANTED,
)


def test_a_hook_that_registers_a_plugin_each_time_it_is_asked_is_blamed_and_coarse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = make_plugin_manager()
    spawner = BoundarySpawner(pm)
    pm.register(spawner, name="wctest_spawner")
    cache = get_decision_cache(pm)
    with caplog.at_level(logging.WARNING, logger="warcore"):
        decision = _within(10, lambda: cache[KEY])
    assert decision.record_point is RecordPoint.NONE
    assert decision.source == "default:failed:wctest_spawner"
    assert decision.failure is not None
    assert (decision.failure.plugin, decision.failure.hook) == (
        "wctest_spawner",
        "warcore_shared_read_boundary",
    )
    # Bounded: a few resolutions, each asking the hook a few times.
    assert spawner.spawned <= 16
    blamed = [r.getMessage() for r in caplog.records if "wctest_spawner" in r.getMessage()]
    assert len(blamed) == 1 and "warcore_shared_read_boundary" in blamed[0], blamed
    # Stored until the plugin set changes: the next replay's lookup asks nobody.
    spawned = spawner.spawned
    assert cache[KEY] is decision and spawner.spawned == spawned
    # The helpers it registered while it looped are unregistered (and no longer listed); it
    # stays registered, blamed.
    names = [name for name, _ in pm.list_name_plugin()]
    assert [n for n in names if n.startswith("wctest_helper_")] == [], names
    assert "wctest_spawner" in names
    assert not [i for i in pm.plugin_infos if i.name.startswith("wctest_helper_")]


def test_each_blame_unregisters_the_helpers_the_hook_registered() -> None:
    """Issue 27: a looping hook had registered ~1,850 helper plugins by the end of a matrix,
    left registered after each blame. Now each blame unregisters them; a plugin registered by
    someone else stays."""
    from warcore.core import get_registry

    pm = make_plugin_manager()
    pm.register(Helper(), name="wctest_helper_other")
    spawner = BoundarySpawner(pm)
    pm.register(spawner, name="wctest_spawner")
    cache = get_decision_cache(pm)
    for backend in sorted(get_registry(pm).backends):
        for mode, kind in (
            (ForwardMode.DECODE, RunnerKind.DECODE),
            (ForwardMode.EXTEND, RunnerKind.PREFILL),
        ):
            key: DecisionKey = (kind, backend, mode, BoundaryContext(), Execution.GRAPH_PLANTED)
            assert _within(10, lambda: cache[key]).source == "default:failed:wctest_spawner"  # noqa: B023
            left = [n for n, _ in pm.list_name_plugin() if n.startswith("wctest_helper")]
            assert left == ["wctest_helper_other"], (key, left)
    assert spawner.spawned > 20  # it really looped, key after key


def test_an_event_owner_hook_that_registers_a_plugin_each_time_means_no_owner() -> None:
    pm = make_plugin_manager()
    spawner = OwnerSpawner(pm)
    pm.register(spawner, name="wctest_spawner")
    owner = _within(10, lambda: get_decision_cache(pm).event_owner("none", StepFacts()))
    assert (owner.owner, owner.source) == (None, "default:failed:wctest_spawner")
    assert spawner.spawned <= 8


def test_a_hook_that_registers_a_plugin_once_keeps_its_answer() -> None:
    pm = make_plugin_manager()
    pm.register(RegistersOnce(pm), name="wctest_once")
    decision = _within(10, lambda: get_decision_cache(pm)[KEY])
    assert (decision.record_point, decision.source) == (
        RecordPoint.POST_REPLAY,
        "plugin:wctest_once",
    )


SPAWNER = """
import itertools
import warcore

_n = itertools.count()


class _Helper:
    @warcore.hookimpl
    def warcore_fast_path_veto(self, forward_mode, context):
        return None


@warcore.hookimpl
def warcore_shared_read_boundary(backend, forward_mode, context):
    warcore.get_plugin_manager().register(_Helper(), name=f"wctest_helper_{next(_n)}")
    return None
"""


def test_matrix_check_and_run_finish_and_name_the_plugin_that_never_settles(
    fake: FakeDists,
) -> None:
    fake.add("wctest_spawner", SPAWNER)
    env = fake.env(WARCORE_PLUGINS="wctest_spawner")
    matrix = run_warcore("matrix", "--json", env=env, timeout=60)
    assert matrix.returncode == 0, matrix.stderr
    rows = {(r["backend"], r["mode"], r["algorithm"]): r for r in json.loads(matrix.stdout)["rows"]}
    cell = rows[("torch_native", "DECODE", "none")]
    assert (cell["record_point"], cell["source"]) == ("none", "default:failed:wctest_spawner")

    check = run_warcore("check", env=env, timeout=60)
    assert check.returncode == 1
    lines = check.stdout.splitlines()
    blamed = [line for line in lines if "wctest_spawner" in line]
    assert len(blamed) == 1 and "warcore_shared_read_boundary" in blamed[0], lines

    run = run_warcore("run", "--requests", "2", env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "identical to the serial loop" in run.stdout
    assert "barriers        coarse" in run.stdout
    warned = [line for line in run.stderr.splitlines() if "wctest_spawner" in line]
    assert len(warned) == 1, run.stderr


# -- run-time registrations are listed with who registered them ------------------------------


@pytest.mark.plugins()
def test_plugins_lists_runtime_registrations_and_who_made_them(fake: FakeDists) -> None:
    fake.add(
        "wctest_outer",
        """
        import warcore


        def _make(**kwargs):
            raise AssertionError("never built")


        class Inner:
            @warcore.hookimpl
            def warcore_attention_backends(self):
                return [warcore.BackendSpec("wctest_inner_backend", _make, "run-time plugin")]


        @warcore.hookimpl
        def warcore_speculative_algorithms():
            pm = warcore.get_plugin_manager()
            if not pm.has_plugin("wctest_inner"):
                pm.register(Inner(), name="wctest_inner")
            return []
        """,
    )
    data = fake.plugins_json()
    plugins = {p["name"]: p for p in data["plugins"]}
    assert plugins["wctest_inner"]["registered_by"] == "plugin:wctest_outer"
    assert plugins["wctest_inner"]["status"] == "active"
    assert plugins["wctest_inner"]["hooks"] == ["warcore_attention_backends"]
    assert plugins["wctest_outer"]["registered_by"] == "entry point"
    assert plugins[BUILTIN_PLUGIN_NAME]["registered_by"] == "core"
    for name in REAL_PLUGINS:
        assert plugins[name]["registered_by"] == "entry point"
    matrix = json.loads(run_warcore("matrix", "--json", env=fake.env()).stdout)
    assert "wctest_inner_backend" in {row["backend"] for row in matrix["rows"]}


def test_a_registration_from_elsewhere_is_runtime_and_unregistering_updates_it(
    fake: FakeDists,
) -> None:
    class Loose:
        @warcore.hookimpl
        def warcore_speculative_algorithms(self) -> list[Any]:
            return []

    pm = fresh_manager()
    pm.register(Loose(), name="wctest_loose")
    loose = plugin_info(pm, "wctest_loose")
    assert loose.registered_by == "runtime" and loose.status == "active"
    pm.unregister(name="wctest_loose")
    assert plugin_info(pm, "wctest_loose").status == "disabled"
