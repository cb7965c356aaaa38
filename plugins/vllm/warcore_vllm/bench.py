"""What warcore-vllm costs a vLLM process at start-up: ``python -m warcore_vllm.bench``.

Each measurement is a fresh process (vLLM loads its plugins once a process) that runs vLLM's
real ``load_general_plugins()``, as the front end, the engine core and each worker do, and,
in the ``runner`` scenario, then imports the module of the runner the installed release's
workers build (:attr:`warcore_vllm.releases.VllmRelease.runner_module`: 0.33.0's V1
``vllm.v1.worker.gpu_model_runner``, 0.34.0's ``vllm.v1.worker.gpu.model_runner``). On a vLLM
warcore-vllm has not audited it says so in one line and exits 2. Variants: ``vllm``
(warcore-vllm installed, ``WARCORE_VLLM=0``), ``warcore`` (``WARCORE_VLLM=1``) and, with
``--base DIR``, ``warcore base`` (``WARCORE_VLLM=1`` with the ``warcore_vllm`` package of
``DIR``, an extracted older checkout, first on ``PYTHONPATH``). A discarded warm-up round
first, then ``--rounds`` rounds, the order of the variants rotated each round; a ratio is
taken inside one round against ``vllm``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from warcore.cli import JsonOutput, Limit

from .gate import current, unsupported_reason

__all__ = ["main", "measure"]

CHILD = """
import json, sys, time
start = time.perf_counter()
import vllm.plugins
imported = time.perf_counter()
vllm.plugins.load_general_plugins()
loaded = time.perf_counter()
if sys.argv[1] == "runner":
    import importlib
    importlib.import_module(sys.argv[2])
print(json.dumps({"import_vllm_s": imported - start, "plugins_s": loaded - imported,
                  "runner_import_s": time.perf_counter() - loaded,
                  "runner_imported": sys.argv[2] in sys.modules}))
"""
SCENARIOS = ("front end", "runner")


def measure(scenario: str, variant: str, base: str | None, runner: str) -> dict[str, Any]:
    """One fresh process of ``scenario`` under ``variant`` (``runner``: the module a worker of
    the installed release imports to build its model runner)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "WARCORE_VLLM": "0"}
    if variant != "vllm":
        env["WARCORE_VLLM"] = "1"
    if variant == "warcore base":
        assert base is not None
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [base, env.get("PYTHONPATH")]))
    arg = "runner" if scenario == "runner" else "front"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, arg, runner],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{scenario}/{variant} failed: {done.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row.update(scenario=scenario, variant=variant, process_s=wall)
    row["lines"] = [line for line in done.stderr.splitlines() if "warcore-vllm:" in line]
    return row


def _summary(rows: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    out = []
    for scenario in SCENARIOS:
        for variant in variants:
            mine = [r for r in rows if r["scenario"] == scenario and r["variant"] == variant]
            ratios = [
                r["process_s"] / own["process_s"]
                for r in mine
                for own in rows
                if own["round"] == r["round"]
                and own["scenario"] == scenario
                and own["variant"] == "vllm"
            ]
            entry: dict[str, Any] = {"scenario": scenario, "variant": variant}
            for key in ("process_s", "plugins_s", "runner_import_s"):
                values = [r[key] for r in mine]
                entry[key] = round(statistics.median(values), 3)
                entry[key + "_min"] = round(min(values), 3)
            entry["ratio_to_vllm"] = round(statistics.median(ratios), 3)
            entry["ratio_min_max"] = [round(min(ratios), 3), round(max(ratios), 3)]
            entry["lines"] = mine[-1]["lines"]
            out.append(entry)
    return out


def _print(summary: list[dict[str, Any]]) -> None:
    print(
        f"{'scenario':<10} {'variant':<13} {'process s':>9} {'plugins s':>9} "
        f"{'runner s':>9} {'x vllm (min-max)':>20}"
    )
    for s in summary:
        low, high = s["ratio_min_max"]
        print(
            f"{s['scenario']:<10} {s['variant']:<13} {s['process_s']:>9.3f} "
            f"{s['plugins_s']:>9.3f} {s['runner_import_s']:>9.3f} "
            f"{s['ratio_to_vllm']:>7.3f} ({low:.3f}-{high:.3f})"
        )
        for line in s["lines"]:
            print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warcore_vllm.bench", description=__doc__)
    parser.add_argument("--rounds", type=Limit(int, 1, 100), default=3, help="rounds (1 to 100)")
    parser.add_argument("--base", help="a folder holding an older warcore_vllm package")
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    args = parser.parse_args(argv)
    if args.base and not (Path(args.base) / "warcore_vllm" / "__init__.py").is_file():
        parser.error(f"--base {args.base}: no warcore_vllm package in that folder")
    output = JsonOutput(parser, args.json)
    reason = unsupported_reason()
    if reason is not None:
        print(f"{parser.prog}: NOT AUDITED: {reason}", file=sys.stderr)
        return 2
    runner = current().runner_module
    variants = ["vllm", "warcore"] + (["warcore base"] if args.base else [])
    load = [os.getloadavg()[0]]
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds + 1):  # round 0: warm-up, discarded
        order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
        for scenario in SCENARIOS:
            for variant in order:
                row = measure(scenario, variant, args.base, runner)
                row["round"] = rnd
                rows.append(row)
                print(f"round {rnd} {scenario:<9} {variant:<12} {row['process_s']:7.3f} s")
        load.append(os.getloadavg()[0])
    summary = _summary([r for r in rows if r["round"] > 0], variants)
    _print(summary)
    print(f"1-minute load average: {load[0]:.2f} before, {min(load):.2f}-{max(load):.2f}")
    command = ["python", "-m", "warcore_vllm.bench", *(argv or sys.argv[1:])]
    return output.write({"command": command, "load": load, "summary": summary, "runs": rows})


if __name__ == "__main__":
    from warcore.cli import run_command

    raise SystemExit(run_command("python -m warcore_vllm.bench", main))
