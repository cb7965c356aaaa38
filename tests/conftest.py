"""The suite's shared fixtures, and what this environment cannot run.

* ``clean_env``: no stray ``WARCORE_*`` variable and no process-wide plugin manager, before or
  after the test (for in-process runs of ``cli.main`` and of the global manager).
* ``fake``: ``clean_env``, and an empty folder on ``sys.path`` where the test installs fake
  plugin distributions (:class:`_support.fake_dists.FakeDists`); the modules imported from it
  are forgotten afterwards.

Helpers that are not fixtures (test plugins and backends, the manager builder
:func:`_support.fresh_manager`) are in the package ``tests/_support``. No test module imports
another.

``--matrix-cell`` (``noxfile.py`` passes it) keeps, of ``tests/``, the tests whose outcome can
depend on what a plugin-matrix cell installs; which those are, and the markers that say so
(``installed``, ``plugin_agnostic``, ``isolated``), is in :mod:`_support.cells`. A test marked
``isolated`` fails wherever it runs if it touched the installed plugins.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from _support import cells
from _support.fake_dists import FakeDists

from warcore.core import reset_plugin_manager

ALL_PLUGINS = ("trtllm_mha", "deepseek_v4", "dflash")
"""The repository's plugin distributions, by entry-point name."""
BROKEN_FIXTURE = "broken_fixture"
"""tests/fixtures/broken_plugin: installed only in the plugin matrix's broken cell."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in [v for v in os.environ if v.startswith("WARCORE_")]:
        monkeypatch.delenv(var)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def fake(clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDists]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield FakeDists(root)
    reset_plugin_manager()
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(root)):
            del sys.modules[name]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--matrix-cell",
        action="store_true",
        help="run as a plugin-matrix cell: of tests/, only the tests whose outcome can depend "
        "on what is installed (tests/_support/cells.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    cells.watch()


_touched_by_fixture: dict[tuple[str, str], set[str]] = {}
_touched_by_module: dict[Path, set[str]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Generator[None, object, object]:
    with cells.recording() as touched:
        try:
            return (yield)
        finally:
            key = (fixturedef.baseid, fixturedef.argname)
            if touched:
                _touched_by_fixture.setdefault(key, set()).update(touched)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    with cells.recording() as touched:  # a module's import-time code
        try:
            return (yield)
        finally:
            if touched and isinstance(collector, pytest.Module):
                _touched_by_module[collector.path] = touched


@pytest.fixture(autouse=True)
def _isolated_touches_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """An ``isolated`` test that read the installed entry points (itself, through a fixture
    or the process-wide plugin manager, which is rebuilt for it) or started a process of this
    environment fails: the matrix cells leave it to the main job on that promise."""
    item = request.node
    if cells.kind(item) != "isolated":
        yield
        return
    reset_plugin_manager()
    with cells.recording() as touched:
        yield
    reset_plugin_manager()
    touched |= _touched_by_module.get(item.path, set())
    for (baseid, name), what in _touched_by_fixture.items():
        if name in request.fixturenames and item.nodeid.startswith(baseid):
            touched |= what
    if touched:
        pytest.fail(
            f"{item.nodeid} is marked isolated but {' and '.join(sorted(touched))}, so the "
            "plugins a matrix cell installs reach it: mark it plugin_agnostic if what it "
            "checks is the same whichever plugins are installed, installed if not "
            "(tests/_support/cells.py)",
            pytrace=False,
        )


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what this environment cannot run: CUDA tests without a GPU, and tests of a plugin
    that is not installed (the plugin-matrix cells install subsets of the plugins). In a cell
    (``--matrix-cell``), deselect the tests the main job alone runs."""
    cuda = _cuda_available()
    installed = {ep.name for ep in md.entry_points(group="warcore")}
    for item in items:
        if "cuda" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "clean_install" in item.keywords and BROKEN_FIXTURE in installed:
            item.add_marker(pytest.mark.skip(reason="a broken plugin is installed (matrix cell)"))
        for marker in item.iter_markers("plugins"):
            missing = sorted(set(marker.args or ALL_PLUGINS) - installed)
            if missing:
                item.add_marker(pytest.mark.skip(reason=f"needs plugin(s) {', '.join(missing)}"))
    if config.getoption("matrix_cell"):
        core = Path(__file__).parent
        left = [item for item in items if not cells.runs_in_cells(item, core)]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if cells.runs_in_cells(item, core)]
