"""Test support for warcore-vllm: every test here needs vLLM 0.33.0 (``nox -s vllm`` installs it
from plugins/vllm/vllm-0.33.0-pins.txt); where it is not installed (the core suite's
environments) the whole folder is skipped.

vLLM's real classes run on the CPU platform (``VLLM_TARGET_DEVICE=cpu``); its modules are
imported once, before any test installs the recording device.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without vLLM
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session", autouse=True)
def _vllm_imported() -> None:
    from warcore_vllm import _harness

    _harness.preload()
