"""The core's contract with the rest of warcore: torch-free, a public surface that outside code
uses without private modules, hook calls that pluggy's tracing sees, and change listeners that
can be removed."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import warcore.core
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary, hookimpl
from warcore.core import WarcorePluginManager, resolve_shared_read_boundary

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

ROOT = Path(__file__).parents[2]

TORCH_FREE = """
import contextlib, io, itertools, json, sys
import warcore
from warcore.cli import main
from warcore.core import (
    BoundaryContext, Execution, ForwardMode, RunnerKind, decide, get_plugin_manager,
    get_registry, resolve_fast_path_veto, resolve_step_event_owner, resolve_war_publish_phase,
)
loaded = {"import warcore": "torch" in sys.modules}
for argv in (["check"], ["matrix", "--json"], ["plugins"], ["plugins", "--json"]):
    with contextlib.redirect_stdout(io.StringIO()):
        main(argv)
    loaded["warcore " + " ".join(argv)] = "torch" in sys.modules
pm = get_plugin_manager()
registry = get_registry(pm)
cells = 0
for backend, mode, algorithm, execution in itertools.product(
    sorted(registry.backends), ForwardMode, sorted(registry.algorithms), Execution
):
    for kind in RunnerKind:
        decide(pm, kind, backend, mode, BoundaryContext(algorithm), execution)
        cells += 1
    resolve_war_publish_phase(algorithm, mode, pm=pm)
    resolve_fast_path_veto(mode, BoundaryContext(algorithm), pm=pm)
for algorithm in registry.algorithms:
    resolve_step_event_owner(algorithm, pm=pm)
loaded["resolving every declaration"] = "torch" in sys.modules
print(json.dumps({"loaded": loaded, "cells": cells, "backends": sorted(registry.backends)}))
"""


@pytest.mark.installed
def test_import_check_matrix_plugins_and_resolving_everything_leave_torch_unloaded() -> None:
    done = subprocess.run(
        [sys.executable, "-c", TORCH_FREE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["loaded"] and not any(result["loaded"].values()), result["loaded"]
    assert {"torch_native", "hybrid", "layer_hybrid"} <= set(result["backends"])
    assert result["cells"] > 0


@pytest.mark.plugin_agnostic
@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
def test_a_command_that_runs_a_forward_says_in_one_line_that_it_needs_torch() -> None:
    # torch blocked in this process (None in sys.modules: "import torch" raises), as it is
    # where only `pip install warcore` was done.
    script = "import sys; sys.modules['torch'] = None\nfrom warcore.cli import main\n"
    script += "sys.exit(main(sys.argv[1:]))"
    for command in (["run", "--requests", "2"], ["sanitize"]):
        done = subprocess.run(
            [sys.executable, "-c", script, *command], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"warcore: error: warcore {command[0]} needs torch, which is not installed: "
            "pip install 'warcore[engine]'"
        ]
    done = subprocess.run(
        [sys.executable, "-c", script, "check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.plugin_agnostic
def test_a_lazy_package_name_says_it_needs_torch() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        import warcore.engine, warcore.runners, warcore.attention  # cheap: nothing imported
        try:
            warcore.engine.Engine
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "warcore.engine.Engine needs torch, which is not installed: pip install 'warcore[engine]'"
    )


def _private_core_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["warcore", "core"] and any(p.startswith("_") for p in parts[2:]):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return found


def test_code_outside_the_core_imports_only_its_public_names() -> None:
    sources = [
        p
        for folder in ("warcore", "plugins", "examples")
        for p in (ROOT / folder).rglob("*.py")
        if "core" not in p.relative_to(ROOT).parts[:2] and ".egg-info" not in str(p)
    ]
    assert len(sources) > 50
    assert [hit for p in sources for hit in _private_core_imports(p)] == []


def test_every_public_name_resolves_and_warcore_reexports_from_the_core() -> None:
    for name in warcore.core.__all__:
        assert getattr(warcore.core, name) is not None, name
    for name in warcore.__all__:
        assert getattr(warcore, name) is getattr(warcore.core, name), name


class _TwoDeclarations:
    """Two plugins' worth of answers for one backend: each must be asked on its own."""

    def __init__(self, boundary: SharedReadBoundary) -> None:
        self.boundary = boundary

    @hookimpl
    def warcore_shared_read_boundary(self, backend: str) -> SharedReadBoundary | None:
        return self.boundary if backend == "wctest_traced" else None


def test_pluggy_monitoring_and_tracing_see_every_plugin_asked_on_its_own() -> None:
    pm = WarcorePluginManager(builtins=False)
    pm.register(_TwoDeclarations(SharedReadBoundary.IN_REPLAY), name="wctest_early")
    pm.register(_TwoDeclarations(SharedReadBoundary.POST_REPLAY), name="wctest_late")
    calls: list[tuple[str, list[str]]] = []
    results: list[Any] = []
    undo = pm.add_hookcall_monitoring(
        lambda hook, impls, kwargs: calls.append((hook, [i.plugin_name for i in impls])),
        lambda outcome, hook, impls, kwargs: results.append(outcome.get_result()),
    )
    try:
        resolved = resolve_shared_read_boundary("wctest_traced", ForwardMode.DECODE, pm=pm)
    finally:
        undo()
    assert resolved.boundary is SharedReadBoundary.POST_REPLAY
    assert resolved.source == "default:conflict"
    asked = [plugins for hook, plugins in calls if hook == "warcore_shared_read_boundary"]
    assert sorted(asked) == [["wctest_early"], ["wctest_late"]]
    assert sorted(r for r in results if r) == sorted(
        [[SharedReadBoundary.IN_REPLAY], [SharedReadBoundary.POST_REPLAY]], key=str
    )

    lines: list[str] = []
    pm.trace.root.setwriter(lines.append)
    undo = pm.enable_tracing()
    try:
        resolve_shared_read_boundary(
            "wctest_traced", ForwardMode.TARGET_VERIFY, BoundaryContext("eagle"), pm=pm
        )
    finally:
        undo()
    traced = [line for line in lines if "warcore_shared_read_boundary" in line]
    assert len(traced) >= 4, lines  # two calls, each with its "finish" line


def test_a_raising_plugin_is_isolated_on_pluggys_path() -> None:
    class Raises:
        @hookimpl
        def warcore_shared_read_boundary(self, backend: str) -> SharedReadBoundary:
            raise RuntimeError("boom")

    pm = WarcorePluginManager(builtins=False)
    pm.register(_TwoDeclarations(SharedReadBoundary.IN_REPLAY), name="wctest_fine")
    pm.register(Raises(), name="wctest_raises")
    resolved = resolve_shared_read_boundary("wctest_traced", ForwardMode.DECODE, pm=pm)
    assert resolved.source == "default:failed:wctest_raises"
    assert resolved.answers == (("wctest_fine", SharedReadBoundary.IN_REPLAY),)
    (failure,) = resolved.failures
    assert failure.error == "RuntimeError: boom"


class _Hostile:
    """An answer, or an exception, whose repr, str and comparisons all raise."""

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def __str__(self) -> str:
        raise RuntimeError("str")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = None  # type: ignore[assignment]


class _HostileError(_Hostile, Exception):
    pass


@pytest.mark.parametrize("hook", ["boundary", "owner", "phase", "raises"])
def test_an_answer_that_raises_when_shown_is_a_failure_naming_the_plugin(hook: str) -> None:
    """The failure line is built from the answer's repr (and an exception's str): one that
    raises there gave a traceback in ``warcore check`` and out of sglang's rank check."""
    from warcore import StepFacts, resolve_step_event_owner, resolve_war_publish_phase

    class Plugin:
        @hookimpl
        def warcore_shared_read_boundary(self, backend: str) -> Any:
            if hook == "raises":
                raise _HostileError()
            return _Hostile() if hook == "boundary" else None

        @hookimpl
        def warcore_step_event_owner(self, algorithm: str) -> Any:
            return _Hostile() if hook == "owner" else None

        @hookimpl
        def warcore_is_war_publish_phase(self, algorithm: str) -> Any:
            return _Hostile() if hook == "phase" else None

    pm = WarcorePluginManager(builtins=False)
    pm.register(Plugin(), name="wctest_hostile")
    resolved: Any
    if hook == "owner":
        resolved = resolve_step_event_owner("wctest_algo", StepFacts(), pm=pm)
        assert resolved.owner is None
    elif hook == "phase":
        resolved = resolve_war_publish_phase("wctest_algo", ForwardMode.TARGET_VERIFY, pm=pm)
        assert resolved.publishes is False
    else:
        resolved = resolve_shared_read_boundary("wctest_traced", ForwardMode.DECODE, pm=pm)
        assert resolved.boundary is SharedReadBoundary.UNKNOWN
    (failure,) = resolved.failures
    assert failure.plugin == "wctest_hostile", failure
    shown = "_HostileError (its message raised)" if hook == "raises" else "whose repr raised"
    assert shown in failure.error, failure.error


def test_a_plugin_calling_sys_exit_in_a_hook_is_that_plugins_failure() -> None:
    """``SystemExit`` from a hook went through the resolution into the engine (sglang's
    scheduler); ``KeyboardInterrupt`` is the operator's and still goes on."""

    class Exits:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        @hookimpl
        def warcore_shared_read_boundary(self, backend: str) -> SharedReadBoundary:
            raise self.error

    pm = WarcorePluginManager(builtins=False)
    pm.register(Exits(SystemExit(3)), name="wctest_exits")
    resolved = resolve_shared_read_boundary("wctest_traced", ForwardMode.DECODE, pm=pm)
    assert resolved.boundary is SharedReadBoundary.UNKNOWN
    assert [(f.plugin, f.error) for f in resolved.failures] == [("wctest_exits", "SystemExit: 3")]
    pm = WarcorePluginManager(builtins=False)
    pm.register(Exits(KeyboardInterrupt()), name="wctest_interrupted")
    with pytest.raises(KeyboardInterrupt):
        resolve_shared_read_boundary("wctest_traced", ForwardMode.DECODE, pm=pm)


def test_a_change_listener_can_be_removed() -> None:
    pm = WarcorePluginManager(builtins=False)
    heard: list[int] = []

    def listener() -> None:
        heard.append(pm.generation)

    pm.add_change_listener(listener)
    pm.set_force_coarse(True)
    assert len(heard) == 1
    pm.remove_change_listener(listener)
    pm.set_force_coarse(False)
    pm.register(_TwoDeclarations(SharedReadBoundary.IN_REPLAY), name="wctest_after")
    assert len(heard) == 1
    pm.remove_change_listener(listener)  # a second removal is harmless


@pytest.mark.parametrize("builtins", [True, False, "warcore.engine.builtin_plugin"])
def test_the_manager_takes_its_builtins_as_a_module_name(builtins: bool | str) -> None:
    pm = WarcorePluginManager(builtins=builtins)
    core = pm.get_plugin("warcore")
    if builtins is False:
        assert core is None and pm.plugin_infos == []
    else:
        assert core is not None and core.__name__ == "warcore.engine.builtin_plugin"
        (info,) = pm.plugin_infos
        assert (info.name, info.registered_by, info.status) == ("warcore", "core", "active")
