"""Fake plugin distributions that ``importlib.metadata`` cannot tell from installed ones.

Each fake plugin is a module plus a ``<name>-<version>.dist-info/`` folder with ``METADATA`` and
``entry_points.txt``, in a folder put on ``sys.path`` (in process) or ``PYTHONPATH`` (``warcore``
run as a subprocess). The ``fake`` fixture (``tests/conftest.py``) gives a test an empty one.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REAL_PLUGINS = {"trtllm_mha", "deepseek_v4", "dflash"}

# Module bodies of the fake plugins.
DECLARES = """
import warcore
from warcore import ForwardMode, SharedReadBoundary


@warcore.hookimpl
def warcore_shared_read_boundary(backend, forward_mode, context):
    if backend == "torch_native" and forward_mode is ForwardMode.EXTEND:
        return SharedReadBoundary.{boundary}
    return None
"""
RAISES_ON_IMPORT = "raise RuntimeError('boom at import')\n"


def marks(path: Path) -> str:
    """A module body line that appends a line to ``path`` whenever the module is imported."""
    return f"open({str(path)!r}, 'a').write('imported\\n')\n"


@dataclass
class FakeDists:
    root: Path

    def add(
        self,
        entry: str,
        source: str,
        *,
        dist: str | None = None,
        version: str = "1.0",
        module: str | None = None,
    ) -> str:
        """Install a fake distribution whose ``warcore`` entry point ``entry`` is a module.

        ``entry`` is a fixture name, ``wctest_<name>`` (the reserved prefix: a real plugin
        cannot take it; ``tests/plugins/test_fixture_names.py``); the distribution is
        ``warcore-fake-<name>`` and the module ``_wcfake_<name>`` unless given."""
        short = entry.removeprefix("wctest_")
        dist = dist or f"warcore-fake-{short.replace('_', '-')}"
        module = module or f"_wcfake_{short}"
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[warcore]\n{entry} = {module}\n")
        importlib.invalidate_caches()
        return module

    def env(self, **variables: str) -> dict[str, str]:
        """A subprocess environment that sees these distributions and no stray WARCORE_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        env.update(variables)
        return env

    def plugins_json(self, **variables: str) -> dict[str, Any]:
        """``warcore plugins --json`` in a subprocess that sees these distributions."""
        result = run_warcore("plugins", "--json", env=self.env(**variables))
        assert result.returncode == 0, result.stderr
        data: dict[str, Any] = json.loads(result.stdout)
        return data


def run_warcore(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warcore", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
