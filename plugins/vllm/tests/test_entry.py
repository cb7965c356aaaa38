"""Activation through vLLM's own plugin loader (``vllm.general_plugins``): opt-in, one start-up
line per process, nothing of vLLM imported by warcore, the runner's module checked and patched
when vLLM imports it (or the activation taken off, vLLM's import unharmed), an unaudited vLLM
refused in one line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from warcore_vllm import _entry, _vllm, activation

CHILD = """
import json, os, sys
import vllm.plugins
hooked = lambda: any(type(f).__name__ == "PostImportFinder" for f in sys.meta_path)
facts = {}
if sys.argv[1] == "changed":
    vllm.plugins.load_general_plugins()  # WARCORE_VLLM unset
    facts.update(hooked_off=hooked())
    print("-- on, against a changed vLLM --", file=sys.stderr, flush=True)
    os.environ["WARCORE_VLLM"] = "1"
    vllm.plugins.plugins_loaded = False  # vLLM's once-a-process flag: load as a new process
    from warcore_vllm import _names  # the installed _sync_device differs from the audited one
    _names.AUDITED["0.33.0"]["vllm.v1.worker.gpu_model_runner"]["GPUModelRunner._sync_device"] = (
        "(self)", "0" * 16)
vllm.plugins.load_general_plugins()
facts.update(runner_imported_by_plugins="vllm.v1.worker.gpu_model_runner" in sys.modules,
             hooked=hooked())
print("-- vLLM imports its runner now --", file=sys.stderr, flush=True)
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from warcore_vllm import activation
facts.update(
    patched=hasattr(vars(GPUModelRunner)["synchronize_input_prep"], "__warcore_original__"),
    hooked_after=hooked(),
    active=activation.is_active(), taken_off=activation.taken_off())
print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def processes() -> Iterator[dict[str, tuple[dict[str, Any], list[str]]]]:
    """Fresh processes (vLLM loads its plugins once a process), run at once: warcore on; and
    warcore off, then (vLLM's once-a-process flag reset) on against a vLLM whose code differs
    from the audited one."""
    started = {}
    for name, flag in (("on", "1"), ("changed", "")):
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "WARCORE_VLLM": flag}
        started[name] = subprocess.Popen(
            [sys.executable, "-c", CHILD, name],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    try:
        for name, process in started.items():
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-3000:]
            lines = [line for line in err.splitlines() if "warcore-vllm:" in line or "--" in line]
            results[name] = (json.loads(out.strip().splitlines()[-1]), lines)
        yield results
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_off_says_so_and_hooks_nothing(processes: Any) -> None:
    facts, lines = processes["changed"]
    assert lines[0].endswith("warcore NOT active: WARCORE_VLLM='' (set it to 1)"), lines
    assert lines[1].startswith("-- on, against a changed vLLM")
    assert not facts["hooked_off"]


def test_on_imports_nothing_and_patches_when_vllm_imports_the_runner(processes: Any) -> None:
    facts, lines = processes["on"]
    assert not facts["runner_imported_by_plugins"] and facts["hooked"]
    armed, marker, active = lines  # one start-up line, then the one line of the activation
    assert "warcore armed in" in armed and "vllm.v1.worker.gpu_model_runner" in armed
    assert marker.startswith("-- vLLM imports")
    assert "warcore active (vLLM 0.33.0" in active and "synchronize_input_prep patched" in active
    assert facts["patched"] and facts["active"] and not facts["hooked_after"]


def test_a_changed_runner_takes_the_activation_off_not_vllm(processes: Any) -> None:
    facts, lines = processes["changed"]
    _, _, armed, marker, off = lines
    assert "warcore armed in" in armed and marker.startswith("-- vLLM imports")
    assert "[ERROR]" in off and "warcore taken off" in off
    assert "code of GPUModelRunner._sync_device" in off and "vLLM's own guards apply" in off
    assert not facts["patched"] and not facts["active"] and not facts["hooked_after"]
    assert facts["taken_off"] in off


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


def test_installed_after_vllm_imported_its_runner_it_is_active_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "1")
    try:
        level, line = _entry.startup_line()
        assert level == logging.INFO and "warcore active (vLLM 0.33.0" in line
        assert activation.is_active()
    finally:
        activation.uninstall()
