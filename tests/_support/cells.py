"""Which of the core's tests a plugin-matrix cell runs, and the check that keeps that honest.

A cell (``matrix.toml``, run by ``noxfile.py`` with ``--matrix-cell``) runs the core's tests
whose outcome can depend on what the cell installs; the main job (``scripts/test.sh``) runs
every test. A test in ``tests/`` says which kind it is with one of three markers, on the test
or on its module (the closest wins):

* ``installed``: what it checks is the installed plugin set, or how it loads: listings
  (``plugins``, ``matrix``, ``check``), loading from the environment, what every installed
  plugin owes. Every cell runs it.
* ``plugin_agnostic``: it loads whatever is installed (the process-wide manager, a manager
  over every entry point, a ``warcore`` process) only as the backdrop of what it checks, the
  core's built-ins and its own ``wctest_`` fixtures. Every cell checks that no installed
  plugin takes the fixture prefix (``tests/plugins/test_fixture_names.py``) or contradicts the
  core's answers (``warcore check`` passes: ``tests/plugins/test_installed_matrix.py``).
  Main job only.
* ``isolated``: it loads no installed plugin and starts no process of this environment; this
  is checked wherever it runs (:func:`touched`). Main job only.

A test marked ``plugins(...)`` runs in the cells that install those plugins (and skips in the
others), whatever else it is marked. A test with none of these markers runs in every cell:
a new test never falls out of the matrix unless it says so. The distributions' own tests
(outside ``tests/``) always run in full.
"""

from __future__ import annotations

import importlib.metadata as md
import multiprocessing.process
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

KINDS = ("installed", "plugin_agnostic", "isolated")
MAIN_ONLY = ("plugin_agnostic", "isolated")
ENTRY_POINT_GROUP = "warcore"


def kind(item: pytest.Item) -> str | None:
    """The closest of ``installed``, ``plugin_agnostic``, ``isolated`` on ``item`` (the
    test's own marker before its class's, its class's before its module's), or ``None``;
    ``installed`` for a test marked ``plugins(...)``."""
    if item.get_closest_marker("plugins") is not None:
        return "installed"
    for _node, mark in item.iter_markers_with_node():
        if mark.name in KINDS:
            return mark.name
    return None


def runs_in_cells(item: pytest.Item, core: Path) -> bool:
    """Whether a plugin-matrix cell runs ``item`` (the module docstring's rule); ``core`` is
    the folder of the core's suite (``tests/``), which a cell runs only in part."""
    if core not in Path(item.path).parents:
        return True  # a distribution's own tests
    return kind(item) not in MAIN_ONLY


# -- what a test touched of the installed environment -----------------------------------------

_sinks: list[set[str]] = []
_watching = False


def _note(what: str) -> None:
    for sink in _sinks:
        sink.add(what)


@contextmanager
def recording() -> Iterator[set[str]]:
    """The installed things touched while the block runs (see :func:`watch`)."""
    sink: set[str] = set()
    _sinks.append(sink)
    try:
        yield sink
    finally:
        _sinks[:] = [s for s in _sinks if s is not sink]  # not remove(): equal sets differ


def _of_this_environment(args: Any) -> bool:
    """Whether a command line starts this environment's interpreter or one of its scripts
    (``warcore``, ``pytest``...): such a process sees every installed distribution."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = os.fsdecode(args).split()[:1]
    program = os.fsdecode(next(iter(args), ""))
    found = shutil.which(program) if program else None
    if found is None:
        return False
    here = Path(sys.executable)
    return Path(os.path.abspath(found)).parent == here.parent or os.path.samefile(found, here)


def _wrap(owner: Any, name: str, what: str, when: Callable[..., bool]) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _sinks and when(*args, **kwargs):
            _note(what)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def watch() -> None:
    """Note, into every :func:`recording` in progress, a read of the ``warcore`` entry points
    (what any plugin manager built from the environment does, the process-wide one included)
    and every process started from this environment (a ``warcore`` command, ``python -c``,
    ``multiprocessing``). Once per process."""
    global _watching
    if _watching:
        return
    _watching = True
    _wrap(
        md,
        "entry_points",
        "read the installed warcore entry points",
        lambda *a, **k: k.get("group") == ENTRY_POINT_GROUP,
    )
    _wrap(
        subprocess.Popen,
        "__init__",
        "started a process of this environment",
        lambda _self, *a, **k: _of_this_environment(a[0] if a else k.get("args", ())),
    )
    _wrap(
        multiprocessing.process.BaseProcess,
        "start",
        "started a multiprocessing process",
        lambda *a, **k: True,
    )
