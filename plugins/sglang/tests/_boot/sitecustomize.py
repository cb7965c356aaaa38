"""Stand-ins for the GPU-only packages sglang imports, in every process of a CPU test run.

Put this folder on ``PYTHONPATH`` (``conftest.py`` does, for the subprocesses of the
warcore-sglang tests: ``warcore matrix``, multiprocessing ``spawn`` children, the benchmark)
and Python imports it at start-up: it appends a finder to the END of ``sys.meta_path`` that
serves ``triton`` and ``torchvision`` (and, when ``WARCORE_SGLANG_STANDINS`` names it,
``sgl_kernel``) from ``../_standins`` only when no other finder found the real package, so a
machine with the real package keeps using it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

STANDINS = Path(__file__).resolve().parent.parent / "_standins"
DEFAULT = ("triton", "torchvision")
ENV = "WARCORE_SGLANG_STANDINS"
"""Comma list of the stand-ins to serve (default ``triton,torchvision``; the real-server tests
add ``sgl_kernel``, which sglang's CPU engine imports)."""


def _names() -> tuple[str, ...]:
    raw = os.environ.get(ENV)
    if raw is None:
        return DEFAULT
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if not (STANDINS / n / "__init__.py").is_file()]
    if unknown:
        raise ImportError(f"{ENV}={raw!r}: no stand-in for {', '.join(unknown)} in {STANDINS}")
    return names


NAMES = _names()


class StandinFinder:
    """Last-resort finder for the stand-in packages (their submodules come from their own
    finders, installed when the stand-in is imported)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in NAMES:
            return None
        init = STANDINS / fullname / "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname, init, submodule_search_locations=[str(init.parent)]
        )


def install() -> None:
    if not any(isinstance(f, StandinFinder) for f in sys.meta_path):
        sys.meta_path.append(StandinFinder())
    if os.environ.get(PD_ENV) == "1" and not any(
        isinstance(f, HostIndicesOff) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, HostIndicesOff())


PD_ENV = "WARCORE_SGLANG_PD_STANDIN"
"""``1`` (the PD tests, plugins/sglang/tests/pd): once sglang's Mooncake connector is imported,
``MooncakeKVSender.supports_host_tensor_indices = False``. A CPU stand-in: left True, the
prefill side's ``_send_kv_chunk`` pins the page indices and records a CUDA event, and the first
request fails with "pin_memory=True requires a CUDA ... backend"; no sglang option turns it
off. False takes sglang's own path for senders without host tensor indices."""
MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"


class HostIndicesOff:
    """Finds sglang's Mooncake connector with the other finders and sets the flag after its
    module body ran (only in processes started with :data:`PD_ENV`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != MOONCAKE_CONN:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _flag_after(spec.loader)
                return spec
        return None


def _flag_after(loader: Any) -> None:
    run = loader.exec_module

    def exec_module(module: Any) -> None:
        run(module)
        module.MooncakeKVSender.supports_host_tensor_indices = False

    loader.exec_module = exec_module


install()
