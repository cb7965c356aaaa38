from __future__ import annotations

import importlib.metadata as md

import pytest

ALL_PLUGINS = ("trtllm_mha", "deepseek_v4", "dflash")
"""The repository's plugin distributions, by entry-point name."""
BROKEN_FIXTURE = "broken_fixture"
"""tests/fixtures/broken_plugin: installed only in the plugin matrix's broken cell."""


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
