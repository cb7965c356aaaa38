"""What a plugin-matrix cell runs of the core's suite (``--matrix-cell``), and the check that
keeps an ``isolated`` test honest (``tests/_support/cells.py``), in a pytest session of their
own under this suite's conftest."""

from __future__ import annotations

import importlib.metadata as md
import textwrap
from pathlib import Path

import pytest
from _support import cells

pytest_plugins = ["pytester"]

# the sessions below touch the installed plugins on purpose, in this process
pytestmark = pytest.mark.plugin_agnostic

CONFTEST = Path(__file__).parents[1] / "conftest.py"

KINDS = """
import subprocess
import sys

import pytest
from warcore.core import get_plugin_manager

pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def manager():
    return get_plugin_manager()


def test_isolated_and_pure():
    assert sorted("ba") == ["a", "b"]


def test_isolated_but_asks_the_process_wide_manager():
    get_plugin_manager()


def test_isolated_but_starts_this_environments_python():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_isolated_but_its_module_fixture_loaded_the_plugins(manager):
    pass


@pytest.mark.plugin_agnostic
def test_agnostic(manager):
    pass


@pytest.mark.installed
def test_installed():
    pass


@pytest.mark.plugins("wctest_absent")
def test_needs_a_plugin():
    pass
"""

UNMARKED = """
def test_new_and_unmarked():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_kinds=textwrap.dedent(KINDS), test_unmarked=UNMARKED)
    return pytester


def test_an_isolated_test_that_reaches_the_installed_plugins_fails_saying_how(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, skipped=1, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*::test_isolated_but_asks_the_process_wide_manager is marked isolated but read "
            "the installed warcore entry points*mark it plugin_agnostic*",
            "*::test_isolated_but_starts_this_environments_python is marked isolated but "
            "started a process of this environment*",
            "*::test_isolated_but_its_module_fixture_loaded_the_plugins is marked isolated "
            "but read the installed warcore entry points*",
        ]
    )


def test_a_cell_keeps_the_installed_the_plugin_marked_and_the_unmarked_tests(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest("--matrix-cell", "--collect-only", "-q", "-p", "no:cacheprovider")
    collected = {line.split("::")[1] for line in result.outlines if "::" in line}
    assert collected == {"test_installed", "test_needs_a_plugin", "test_new_and_unmarked"}
    result.stdout.fnmatch_lines(["*3/8 tests collected (5 deselected)*"])


def test_nested_recordings_each_note_what_happened_inside_them() -> None:
    with cells.recording() as outer:
        with cells.recording() as inner:
            pass
        md.entry_points(group="warcore")
    assert (inner, outer) == (set(), {"read the installed warcore entry points"})
