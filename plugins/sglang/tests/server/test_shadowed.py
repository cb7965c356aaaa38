"""A folder ``warcore/`` without ``__init__.py`` in the directory a ``python -m`` (or ``-c``)
runs from shadows the installed package (the working directory comes first on ``sys.path``;
this session installs warcore editable, whose import hook comes after the path finder). The
activation must not fail silently: the launcher refuses to start, and sglang's own loader
logs one ERROR start-up line naming the folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from warcore_sglang.serving import harness as serving


def _shadowing_dir(tmp_path: Path) -> Path:
    (tmp_path / "warcore").mkdir()
    (tmp_path / "warcore" / "notes.txt").write_text("a folder named warcore, no __init__.py\n")
    return tmp_path


def _python(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **serving.cpu_env(), "WARCORE_SGLANG": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_folder_really_shadows_warcore_here(tmp_path: Path) -> None:
    cwd = _shadowing_dir(tmp_path)
    found = _python(["-c", "import warcore; print(getattr(warcore, '__file__', None))"], cwd)
    assert found.stdout.strip() == "None", found  # a namespace package, not the installed one


def test_the_launcher_refuses_to_start_without_warcore(tmp_path: Path, model: Path) -> None:
    cwd = _shadowing_dir(tmp_path)
    port = serving.free_port()
    argv = ["-m", "warcore_sglang.serving.launch_server", *serving.cpu_server_argv(model)]
    done = _python([*argv, "--host", "127.0.0.1", "--port", str(port)], cwd)
    assert done.returncode == 2, done
    assert f"shadowed by the folder {cwd / 'warcore'}" in done.stderr, done.stderr
    assert "Uvicorn running" not in done.stdout + done.stderr  # no server was started


def test_sglangs_loader_logs_an_error_naming_the_folder(tmp_path: Path) -> None:
    cwd = _shadowing_dir(tmp_path)
    done = _python(["-c", "from sglang.srt.plugins import load_plugins; load_plugins()"], cwd)
    assert done.returncode == 0, done  # sglang carries on (with its own declarations)
    lines = [line for line in done.stderr.splitlines() if "warcore-sglang: process" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("[ERROR]") and "warcore NOT active" in lines[0]
    assert f"shadowed by the folder {cwd / 'warcore'}" in lines[0]
