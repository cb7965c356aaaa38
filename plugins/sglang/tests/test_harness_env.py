"""The harness's environment for sglang's processes on a CPU: from a source checkout it brings
the stand-ins itself, whatever the caller's ``PYTHONPATH`` and working folder (the benchmarks'
commands and a user's script rely on it; the tests set ``PYTHONPATH`` themselves, which hid a
boot folder looked for one level too shallow after the harness moved into ``serving/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from warcore_sglang.serving import harness

pytestmark = pytest.mark.any_release  # the harness's own working, on whichever release


def test_a_child_started_elsewhere_without_pythonpath_finds_the_standins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = {**os.environ, **harness.cpu_env()}
    assert (harness.BOOT / "sitecustomize.py").is_file(), harness.BOOT
    probe = "import triton, sgl_kernel; print(triton.__file__)"
    child = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert str(harness.BOOT.parent) in child.stdout, child.stdout  # the stand-in, not a real one
