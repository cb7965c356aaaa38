"""The suite's shared fixtures, and what this environment cannot run.

* ``clean_env``: no stray ``WARCORE_*`` variable and no process-wide plugin manager, before or
  after the test (for in-process runs of ``cli.main`` and of the global manager).
* ``fake``: ``clean_env``, and an empty folder on ``sys.path`` where the test installs fake
  plugin distributions (:class:`_support.fake_dists.FakeDists`); the modules imported from it
  are forgotten afterwards.

Helpers that are not fixtures (test plugins and backends, the manager builder
:func:`_support.fresh_manager`) are in the package ``tests/_support``. No test module imports
another.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
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


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what this environment cannot run: CUDA tests without a GPU, and tests of a plugin
    that is not installed (the plugin-matrix cells install subsets of the plugins)."""
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
