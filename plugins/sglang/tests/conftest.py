"""Test support for warcore-sglang: import-only stand-ins for GPU-only modules sglang imports,
in this process and in every subprocess the tests start.

sglang 0.5.23 imports ``triton`` and ``torchvision`` at module level. On a CPU-only machine
neither is installed (the registry's torchvision is a CUDA build that fails to load against the
CPU torch), so each is stood in by ``_standins/<name>``, but only where no real package is found:
``_boot/sitecustomize.py`` appends a last-resort finder to ``sys.meta_path``. It is loaded here,
and ``_boot`` is put on ``PYTHONPATH`` for the subprocesses (``warcore matrix``, a
multiprocessing ``spawn`` child, the benchmark), where Python imports it at start-up.

Every test here needs sglang: where it is not installed (the core suite's environments) the
whole folder is skipped.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

BOOT = Path(__file__).resolve().with_name("_boot")

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without sglang
else:
    spec = importlib.util.spec_from_file_location("_warcore_sglang_boot", BOOT / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    _boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_boot)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BOOT), os.environ.get("PYTHONPATH", "")) if p
    )
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@pytest.fixture
def pm() -> Iterator[object]:
    """The process-wide plugin manager (what the activation consults); plugins a test
    registers on it are unregistered afterwards, and force-coarse is switched back off."""
    import warcore

    manager = warcore.get_plugin_manager()
    before = {name for name, _ in manager.list_name_plugin()}
    yield manager
    for name, _ in list(manager.list_name_plugin()):
        if name not in before:
            manager.unregister(name=name)
    manager.set_force_coarse(False)


@pytest.fixture
def installed(pm: object) -> Iterator[object]:
    """warcore-sglang installed in this process for the test, uninstalled after it."""
    import warcore_sglang

    warcore_sglang.install()
    try:
        yield pm
    finally:
        warcore_sglang.uninstall()
