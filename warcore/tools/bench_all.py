"""``warcore bench all``: every benchmark with its defaults, each writing its JSON result.

This is the command behind BENCHMARKS.md. It takes several minutes on the 2-vCPU development
machine (the sweep dominates); each benchmark can be run on its own with other sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from warcore.tools import bench_lookup, bench_overlap, bench_sanitizer, bench_startup
from warcore.tools._bench_common import command_line, machine_info, result_path

__all__ = ["configure", "run"]

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _benches() -> list[tuple[str, Configure, Run, list[str]]]:
    benches: list[tuple[str, Configure, Run, list[str]]] = [
        # bench_lookup writes JSON only when asked; give it the same default place.
        (
            "lookup",
            bench_lookup.configure,
            bench_lookup.run,
            ["--json", str(result_path("lookup", None))],
        ),
        ("overlap", bench_overlap.configure_overlap, bench_overlap.run_overlap, []),
        ("sweep", bench_overlap.configure_sweep, bench_overlap.run_sweep, []),
        ("startup", bench_startup.configure, bench_startup.run, []),
        ("sanitizer", bench_sanitizer.configure, bench_sanitizer.run, []),
    ]
    return benches


def _complete_lookup(path: Path, argv: list[str] | None) -> None:
    """Give the lookup result what the others carry (bench_lookup writes only its numbers)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data = {"benchmark": "lookup", "command": command_line(argv), **data}
    data["machine"] = machine_info()
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", metavar="FILE", help="also draw the sweep to FILE (PNG)")


def run(args: argparse.Namespace) -> int:
    if args.plot:
        from warcore.tools import plot

        missing = plot.missing_matplotlib()
        if missing:  # before minutes of measuring, not after
            print(f"warcore: error: {missing}", file=sys.stderr)
            return 2
    status = 0
    for name, configure_one, run_one, argv in _benches():
        parser = argparse.ArgumentParser(prog=f"warcore bench {name}")
        configure_one(parser)
        if name == "sweep" and args.plot:
            argv = [*argv, "--plot", args.plot]
        print(f"== warcore bench {name} {' '.join(argv)}".rstrip(), flush=True)
        sub_args = parser.parse_args(argv)
        sub_args.argv = getattr(args, "argv", None)  # each result records `warcore bench all`
        code = run_one(sub_args)
        if name == "lookup" and code == 0:
            _complete_lookup(Path(argv[-1]), sub_args.argv)
        print(flush=True)
        if code:
            print(f"warcore: bench {name} exited {code}", file=sys.stderr)
            status = status or code
    return status
