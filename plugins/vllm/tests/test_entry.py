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
from vllm_release import requires
from warcore_vllm import _entry, activation, gate
from warcore_vllm.gate import current

PATCHED = requires("v1-event")
"""The activation patches the V1 runner: 0.33.0's (0.34.0 removed Model Runner V1)."""

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
    from warcore_vllm.releases import RELEASES  # the installed _sync_device differs from the entry
    rows = RELEASES["0.33.0"].functions["vllm.v1.worker.gpu_model_runner"]
    rows["GPUModelRunner._sync_device"] = ("(self)", "0" * 16)
vllm.plugins.load_general_plugins()
facts.update(runner_imported_by_plugins="vllm.v1.worker.gpu_model_runner" in sys.modules,
             hooked=hooked())
print("-- vLLM imports its runner now --", file=sys.stderr, flush=True)
import vllm.v1.worker.gpu_worker  # a worker's modules (the V2 runner's among them)
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # a V1 worker builds a V1 runner
from warcore_vllm import activation
facts.update(
    patched=hasattr(vars(GPUModelRunner)["synchronize_input_prep"], "__warcore_original__"),
    hooked_after=hooked(),
    active=activation.is_active(), taken_off=activation.taken_off())
print(json.dumps(facts))
"""


V2_WORKER = """
import importlib, json, sys
import vllm.plugins
vllm.plugins.load_general_plugins()
print("-- a worker imports its modules --", file=sys.stderr, flush=True)
import vllm.v1.worker.gpu_worker
from warcore_vllm.audit import _mrv2, _v2checks
from warcore_vllm.gate import current
for name in current().preload:  # what the harness builds a runner with; a V2 worker never
    if name != "vllm.v1.worker.gpu_model_runner":  # imports the V1 runner's module
        importlib.import_module(name)
print("-- it builds its runner (EAGLE, dual-batch overlap) --", file=sys.stderr, flush=True)
shape = _mrv2.Shape("a worker's runner", speculative_tokens=2, microbatches=2)
ring = _v2checks.run(shape, lambda v2: None)
print(json.dumps({"depth": ring.depth, "v1": "vllm.v1.worker.gpu_model_runner" in sys.modules}))
"""


def _run(code: str, flag: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "WARCORE_VLLM": flag}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _results(
    started: dict[str, subprocess.Popen[str]],
) -> Iterator[dict[str, tuple[dict[str, Any], list[str]]]]:
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


@pytest.fixture(scope="module")
def processes() -> Iterator[dict[str, tuple[dict[str, Any], list[str]]]]:
    """Fresh processes (vLLM loads its plugins once a process), run at once: one that does
    what a V2 worker does (vLLM's plugins, then its modules, then its runner); and, where the
    release has a V1 runner, a V1 worker with warcore on, and warcore off, then (vLLM's
    once-a-process flag reset) on against a vLLM whose code differs from the audited one."""
    started = {"v2": _run(V2_WORKER, "1")}
    if "v1 runner" in current().watched.values():
        started.update(
            (name, _run(CHILD, flag, name)) for name, flag in (("on", "1"), ("changed", ""))
        )
    yield from _results(started)


@PATCHED
def test_off_says_so_and_hooks_nothing(processes: Any) -> None:
    facts, lines = processes["changed"]
    assert lines[0].endswith("warcore NOT active: WARCORE_VLLM='' (set it to 1)"), lines
    assert lines[1].startswith("-- on, against a changed vLLM")
    assert not facts["hooked_off"]


@PATCHED
def test_on_imports_nothing_and_patches_when_vllm_imports_the_runner(processes: Any) -> None:
    facts, lines = processes["on"]
    assert not facts["runner_imported_by_plugins"] and facts["hooked"]
    armed, marker, active = lines  # one start-up line, then the one line of the activation
    assert "warcore armed on vLLM 0.33.0 in" in armed and "vllm.v1.worker.gpu_model_runner" in armed
    assert marker.startswith("-- vLLM imports")
    assert "warcore active on vLLM 0.33.0 (" in active
    assert "GPUModelRunner.synchronize_input_prep: an overlapped runner" in active
    assert facts["patched"] and facts["active"] and not facts["hooked_after"]


@PATCHED
def test_a_changed_runner_takes_the_activation_off_not_vllm(processes: Any) -> None:
    facts, lines = processes["changed"]
    _, _, armed, marker, off = lines
    assert "warcore armed on vLLM 0.33.0 in" in armed and marker.startswith("-- vLLM imports")
    assert "[ERROR]" in off and "warcore taken off on vLLM 0.33.0: vLLM 0.33.0 at " in off
    assert "code of GPUModelRunner._sync_device" in off and "vLLM's own guards apply" in off
    assert not facts["patched"] and not facts["active"] and not facts["hooked_after"]
    assert facts["taken_off"] in off


WARMUPS = {
    "0.33.0": ("run_mixed_prefill_decode_warmup", "_warmup_kernels"),
    "0.34.0": ("_warmup_kernels",),
}
"""The warmups that run their steps back to back in each release (VLLM-0.34 §3.2)."""


def test_a_v2_worker_says_what_warcore_changed_once_it_builds_its_runner(processes: Any) -> None:
    """Armed at vLLM's plugin loading; active once its runner is built (not before: the line
    names that runner's ring depth), with each change warcore made in the process."""
    facts, lines = processes["v2"]
    version = str(gate.installed_version())
    armed, modules, builds, active = lines
    assert f"warcore armed on vLLM {version} in" in armed
    assert modules.startswith("-- a worker imports") and builds.startswith("-- it builds")
    assert f"warcore active on vLLM {version} (" in active
    changes = [
        "ring depth 2 -> 6 (2 microbatches: the model state stages 2 times a step; the drafter "
        "reads sampler slots after copy_event: one more step in flight)",
        "a step that schedules no tokens: a device synchronize after it (it has no release)",
        "a runner whose model state stages in dummy runs (DeepseekV41ModelState): each step "
        "waits for the one that last used its slots (an event ring)",
        *(
            f"{w}: a device synchronize before each of its steps and after the last"
            for w in WARMUPS[version]
        ),
    ]
    assert active.endswith("): " + "; ".join(changes)), active
    assert facts == {"depth": 6, "v1": False}
    if version == "0.33.0":  # the V1 runner's module is watched, and not waited for
        assert "vllm.v1.worker.gpu_model_runner not imported (a V2 runner is built)" in active


def test_an_unaudited_version_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "1")
    monkeypatch.setattr(gate, "installed_version", lambda: "0.33.0+cpu")
    level, line = _entry.startup_line()
    assert level == logging.ERROR
    assert "NOT active, vLLM's own guards apply" in line
    assert "vLLM 0.33.0+cpu is not a release warcore-vllm has audited" in line
    assert "\n" not in line
    assert not activation.is_installed()


def test_a_value_neither_on_nor_off_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "maybe")
    level, line = _entry.startup_line()
    assert level == logging.WARNING and "WARCORE_VLLM='maybe'" in line
    assert not activation.is_installed()


def test_installed_after_vllm_imported_its_modules_it_is_active_at_once_naming_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Either audited release, its watched modules imported already (the session's preload):
    one line, active, naming the release in force and what it checked."""
    from warcore_vllm.releases import RELEASES

    version = str(gate.installed_version())
    monkeypatch.setenv(_entry.ENV_ACTIVATE, "1")
    try:
        level, line = _entry.startup_line()
        assert level == logging.INFO and f"warcore active on vLLM {version} (" in line, line
        assert ", ".join(RELEASES[version].watched) + " checked against the audited code" in line
        assert activation.is_active() and "\n" not in line
    finally:
        activation.uninstall()
