"""Activation through vLLM's own plugin loader (``vllm.general_plugins``): opt-in, one start-up
line per process, an unaudited vLLM refused in that line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from warcore_vllm import _entry, _vllm, activation

LOAD = "import vllm.plugins as p; p.load_general_plugins()"


def _load_in_a_process(**env: str) -> subprocess.CompletedProcess[str]:
    """vLLM's real ``load_general_plugins()`` in a fresh process (it loads once a process)."""
    environ = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", **env}
    environ.pop("WARCORE_VLLM", None)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", LOAD], env=environ, capture_output=True, text=True, timeout=300
    )


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if "warcore-vllm:" in line]


def test_vllms_loader_runs_the_entry_point_opt_in() -> None:
    off = _load_in_a_process()
    on = _load_in_a_process(WARCORE_VLLM="1")
    assert off.returncode == 0 and on.returncode == 0, off.stderr[-2000:] + on.stderr[-2000:]
    (off_line,) = _lines(off)
    (on_line,) = _lines(on)
    assert "warcore NOT active: WARCORE_VLLM=''" in off_line
    assert "warcore active in" in on_line and "vLLM 0.33.0" in on_line


def test_an_unaudited_version_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "1")
    monkeypatch.setattr(_vllm, "installed_version", lambda: "0.33.0+cpu")
    level, line = _entry.startup_line()
    assert level == logging.ERROR
    assert "NOT active" in line and "vLLM 0.33.0+cpu is installed" in line
    assert "\n" not in line
    assert not activation.is_installed()


def test_a_value_neither_on_nor_off_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "maybe")
    level, line = _entry.startup_line()
    assert level == logging.WARNING and "WARCORE_VLLM='maybe'" in line
    assert not activation.is_installed()
