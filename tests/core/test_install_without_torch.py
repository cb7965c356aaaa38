"""``pip install warcore`` into a fresh virtual environment without torch: the declaration
commands work, torch is not installed, and a command that runs a forward says what to install.

Builds and installs from a copy of the source (so the checkout gets no build/ or egg-info),
with pip's configured indexes; about 25 s on an idle development machine. Every process of the
fresh environment runs with a clean environment: a ``PYTHONPATH`` or ``WARCORE_*`` of the
caller's would let it see (or select) plugins that are not installed in it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _support.fake_dists import DECLARES, FakeDists

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.slow


_KEPT = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "SSL_CERT_FILE", "SSL_CERT_DIR")


def _clean_environment() -> dict[str, str]:
    """What a fresh environment's processes see of ours: where programs and home are, the
    locale, and pip's configuration (its indexes, ``PIP_*``), nothing that adds packages or
    plugins (``PYTHONPATH``, ``PYTHONHOME``, ``VIRTUAL_ENV``) or selects them (``WARCORE_*``)."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in _KEPT or name.startswith("PIP_") or name.lower().endswith("_proxy")
    }


def _run(*args: str | Path, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=_clean_environment(),
    )


def test_pip_install_without_torch_gives_the_declaration_commands(
    tmp_path: Path, fake: FakeDists, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plugin on the caller's PYTHONPATH (a developer's, a CI job's) must not reach the fresh
    # environment: its listing would hold two plugins ("too many values to unpack").
    fake.add("wctest_stray", DECLARES.format(boundary="POST_REPLAY"))
    monkeypatch.setenv("PYTHONPATH", str(fake.root))
    monkeypatch.setenv("WARCORE_PLUGINS", "wctest_stray")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "warcore", source / "warcore", ignore=shutil.ignore_patterns("__pycache__")
    )
    venv = tmp_path / "venv"
    made = _run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    bin_dir = venv / "bin"
    installed = _run(bin_dir / "python", "-m", "pip", "install", "-q", source, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]

    listed = _run(bin_dir / "python", "-m", "pip", "list", "--format=json")
    packages = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"warcore", "pluggy", "packaging"} <= packages and "torch" not in packages, packages

    warcore = bin_dir / "warcore"
    plugins = _run(warcore, "plugins", "--json")
    assert plugins.returncode == 0, plugins.stderr
    (core,) = json.loads(plugins.stdout)["plugins"]
    assert (core["name"], core["status"], core["registered_by"]) == ("warcore", "active", "core")
    matrix = _run(warcore, "matrix", "--json")
    assert matrix.returncode == 0, matrix.stderr
    backends = {row["backend"] for row in json.loads(matrix.stdout)["rows"]}
    assert {"torch_native", "hybrid", "layer_hybrid"} <= backends
    check = _run(warcore, "check")
    assert check.returncode == 0, check.stderr
    *staging, last = check.stdout.strip().splitlines()
    assert last == "ok", check.stdout
    # The built-in algorithms' prefill staging answers (informational), nothing else.
    assert [line.split("'")[1] for line in staging] == ["eagle", "none"], staging
    run = _run(warcore, "run", "--requests", "2")
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "warcore: error: warcore run needs torch, which is not installed: "
        "pip install 'warcore[engine]'"
    )
