"""Test support for warcore-vllm: every test here needs an audited vLLM release (``nox -s vllm``
installs each from ``plugins/vllm/vllm-<version>-pins.txt``). Where vLLM is not installed (the
core suite's environments) the whole folder is skipped; where an unaudited release is, every
test is skipped with one reason naming it; a test that needs a check the installed release
does not have (the V1 runner's, on 0.34.0) is skipped naming the release
(``vllm_release.requires``).

vLLM's real classes run on the CPU platform (``VLLM_TARGET_DEVICE=cpu``); its modules are
imported once, before any test installs the recording device.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
from vllm_release import unaudited

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without vLLM
else:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = unaudited()
    if reason is not None:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def _vllm_imported() -> None:
    if unaudited() is None:
        from warcore_vllm.audit import _harness

        _harness.preload()


@pytest.fixture(scope="session")
def command() -> tuple[int, str, list[Any]]:
    """One run of every check of the installed release, without warcore, reported as ``python
    -m warcore_vllm.audit`` reports it (``audit.report``: what ``main`` prints after its
    gate)."""
    from warcore_vllm import audit

    verdicts = audit.audit()
    status, text = audit.report(verdicts)
    return status, text, verdicts
