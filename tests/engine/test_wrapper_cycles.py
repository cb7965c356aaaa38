"""A broken wrapper never breaks the tools that diagnose it.

Two wrappers whose ``children_for`` name each other (with names built at run time, so never
the same string object twice), a wrapper that names itself, and wrappers whose
``children_for`` yields ``None`` or a number: every cell of theirs is the coarse fence blamed
on the plugin (``default:failed:<plugin>``), ``warcore check`` names the plugin and the
cycle once, every other cell is what it is without them, and ``check``, ``matrix`` and
``plugins`` run to the end.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from _support.fake_dists import FakeDists, run_warcore

from warcore import (
    BackendSpec,
    BoundaryContext,
    ForwardMode,
    RecordPoint,
    SharedReadBoundary,
    hookimpl,
    resolve_shared_read_boundary,
)
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.matrix import build_matrix, find_problems
from warcore.testing import make_plugin_manager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

PLUGIN = "wctest_cycles"
BROKEN = {"wctest_ping", "wctest_pong", "wctest_selfish", "wctest_none_child", "wctest_int_child"}


def _named(*parts: str) -> str:
    return "".join(parts)  # a new string object on every call, equal to the last one


CYCLES = """
import warcore
from warcore import BackendSpec


def _never_built(**kwargs):
    raise RuntimeError("only resolved here, never built")


def _ping(mode, context):
    return ("".join(["wctest_", "pong"]),)  # built at run time: a new object each call


def _pong(mode, context):
    return ["".join(["wctest_", "ping"])]


def _selfish(mode, context):
    return ("torch_native", "".join(["wctest_", "selfish"]))


def _none_child(mode, context):
    yield "torch_native"
    yield None


def _int_child(mode, context):
    return (7,)


@warcore.hookimpl
def warcore_attention_backends():
    return [
        BackendSpec("wctest_ping", _never_built, children_for=_ping),
        BackendSpec("wctest_pong", _never_built, children_for=_pong),
        BackendSpec("wctest_selfish", _never_built, children_for=_selfish),
        BackendSpec("wctest_none_child", _never_built, children_for=_none_child),
        BackendSpec("wctest_int_child", _never_built, children_for=_int_child),
    ]
"""


def _cycles_plugin() -> types.ModuleType:
    """The same plugin module as the installed one of the command-line test, in process."""
    module = types.ModuleType(PLUGIN)
    exec(compile(CYCLES, PLUGIN, "exec"), module.__dict__)
    return module


def test_broken_wrappers_are_coarse_blamed_on_their_plugin_and_nothing_else_changes() -> None:
    clean = make_plugin_manager()
    broken = make_plugin_manager()
    broken.register(_cycles_plugin(), name=PLUGIN)

    rows = build_matrix(broken)
    theirs = [r for r in rows if r.backend in BROKEN]
    assert {r.backend for r in theirs} == BROKEN
    for row in theirs:
        assert row.declared.boundary is SharedReadBoundary.UNKNOWN, row
        assert row.declared.source == f"default:failed:{PLUGIN}", row
        assert row.record_point is RecordPoint.NONE and row.eager_point is RecordPoint.NONE, row
    others = [r.as_dict() for r in rows if r.backend not in BROKEN]
    assert others == [r.as_dict() for r in build_matrix(clean)]

    problems = find_problems(broken)
    # One line each: the cycle (whichever wrapper of it a cell starts from), the wrapper that
    # names itself, and the two bad children; every line names the plugin.
    assert len(problems) == 4, problems
    assert all(f"plugin {PLUGIN!r}" in p for p in problems), problems
    for what in [
        "wrapper backends form a cycle: wctest_ping -> wctest_pong -> wctest_ping",
        "wrapper backends form a cycle: wctest_selfish -> wctest_selfish",
        "named None (NoneType) as a child of 'wctest_none_child'",
        "named 7 (int) as a child of 'wctest_int_child'",
    ]:
        assert sum(what in p for p in problems) == 1, (what, problems)


def test_a_built_wrapper_whose_children_for_names_none_is_coarse() -> None:
    """(A built wrapper that is its own child: tests/cli/test_bad_input.py.)"""

    class NoneChild(TorchNativeBackend):
        name = "wctest_none_child_object"

        def __init__(self) -> None:  # no pool needed: only resolved, never run
            pass

        def children_for(self, forward_mode: ForwardMode, context: BoundaryContext) -> Any:
            return (None,)

    resolved = resolve_shared_read_boundary(NoneChild(), ForwardMode.DECODE)
    assert (resolved.boundary, resolved.source) == (
        SharedReadBoundary.UNKNOWN,
        "default:failed:backend:wctest_none_child_object",
    )
    assert "named None (NoneType) as a child" in resolved.failures[0].error


def test_a_wrapper_over_the_same_backend_twice_is_no_cycle() -> None:
    """Siblings with one name (layer i uses child i mod n) are not a cycle: only a wrapper
    that is its own ancestor is."""

    class Twice:
        @hookimpl
        def warcore_attention_backends(self) -> list[BackendSpec]:
            def never(**kwargs: Any) -> Any:
                raise RuntimeError("not built")

            return [
                BackendSpec(
                    "wctest_twice",
                    never,
                    children_for=lambda mode, ctx: (_named("torch_", "native"), "torch_native"),
                )
            ]

    pm = make_plugin_manager(Twice())
    resolved = resolve_shared_read_boundary("wctest_twice", ForwardMode.DECODE, pm=pm)
    assert resolved.failures == () and len(resolved.children) == 2
    assert (
        resolved.boundary is resolve_shared_read_boundary("torch_native", "DECODE", pm=pm).boundary
    )


def test_check_matrix_and_plugins_run_to_the_end(fake: FakeDists) -> None:
    fake.add(PLUGIN, CYCLES)
    env = fake.env(WARCORE_PLUGINS=PLUGIN)
    check = run_warcore("check", env=env, timeout=120)
    assert (check.returncode, "Traceback" in check.stderr) == (1, False), check.stderr
    lines = check.stdout.splitlines()
    assert any("wctest_ping -> wctest_pong -> wctest_ping" in line and PLUGIN in line
               for line in lines), lines  # fmt: skip

    matrix = run_warcore("matrix", "--json", env=env, timeout=120)
    assert (matrix.returncode, "Traceback" in matrix.stderr) == (0, False), matrix.stderr
    rows = json.loads(matrix.stdout)["rows"]
    sources = {r["boundary_source"] for r in rows if r["backend"] in BROKEN}
    assert sources == {f"default:failed:{PLUGIN}"}

    plugins = run_warcore("plugins", "--json", env=env, timeout=120)
    assert (plugins.returncode, "Traceback" in plugins.stderr) == (0, False), plugins.stderr
    listed = {p["name"]: p for p in json.loads(plugins.stdout)["plugins"]}
    assert listed[PLUGIN]["status"] == "active"
