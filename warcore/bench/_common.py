"""What every ``warcore bench`` result shares: the machine, the command, statistics, output.

Numbers from a noisy 2-vCPU machine mean little without the machine and the exact command next
to them, so every JSON result carries both. Statistics are medians and minima over repeated,
interleaved runs; ratios are taken inside one round (configurations measured back to back), so
slow drift of the machine cancels out of them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from warcore._files import write_text

__all__ = [
    "RESULTS_DIR",
    "command_line",
    "format_table",
    "machine_info",
    "result_path",
    "summarise",
    "write_result",
]

RESULTS_DIR = Path("benchmarks") / "results"
"""Default folder of the JSON results, relative to the working directory (the repo root)."""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """HEAD of the repository in the working directory (where results are written), with
    ``+dirty`` when the tree has changes (benchmarks are often run uncommitted)."""
    root = Path.cwd()

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=5, check=True
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info(device: str | None = None) -> dict[str, Any]:
    """The machine a result was measured on (imports torch: call it after the measurement)."""
    import torch

    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "git": _git_commit(),
    }
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that produced this result (``warcore ...``): ``argv`` as the CLI got it
    (``cli.main`` keeps it as ``args.argv``), else this process's arguments."""
    return shlex.join(["warcore", *(sys.argv[1:] if argv is None else argv)])


def result_path(name: str, override: str | None) -> Path:
    return Path(override) if override else RESULTS_DIR / f"{name}.json"


def write_result(
    name: str, data: dict[str, Any], override: str | None, argv: Sequence[str] | None = None
) -> Path:
    """Write ``data`` (with the command) as the JSON result ``name``, whole or not at all
    (:func:`warcore._files.write_text`); returns the path."""
    path = result_path(name, override)
    payload = {"benchmark": name, "command": command_line(argv), **data}
    write_text(path, json.dumps(payload, indent=2) + "\n")
    return path


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Median, minimum and maximum of repeated measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """First column left-aligned, the others right-aligned (numbers), two spaces apart."""
    table = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = []
    for row in table:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
