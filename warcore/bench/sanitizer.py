"""The WAR sanitizer's cost per forward: ``warcore bench sanitizer``.

For each backend x algorithm, in rounds (the order rotates each round), the same trace and the
same engine configuration (:func:`warcore.audit.sanitizer.engine_config`: the serial loop, the
reference model in float64) is served

* ``plain``: by a bare engine (``engine.run`` timed, after the graph-capture warm-up finished);
* ``sanitize``: by :func:`warcore.audit.sanitizer.sanitize`, which serves it twice, a clean
  instrumented run and a poisoned one, and compares them, then serves it once more with the
  overlap loop for the binding audit; its own ``run_s`` gives the three ``engine.run`` times
  (``bindings``: the binding run), and ``elapsed_s`` everything (the engines built, the runs,
  the comparison).

All as milliseconds per forward, and the instrumented runs as ratios to the plain one. The
sanitizer is a test-time tool; this says what a conformance check costs, not a serving cost.
"""

from __future__ import annotations

import time
from typing import Any

from warcore.bench._common import format_table, machine_info, summarise

__all__ = ["COMBINATIONS", "measure", "table"]

COMBINATIONS = (("torch_native", "none"), ("trtllm_mha", "none"), ("deepseek_v4", "dflash"))


def _plain_run(backend: str, algorithm: str, requests: int, seed: int) -> tuple[float, int]:
    """Seconds of ``engine.run`` and forwards launched, without the sanitizer."""
    from warcore.audit.sanitizer import engine_config, trace_for
    from warcore.engine import Engine

    config = engine_config(backend, algorithm)
    trace = trace_for(requests, seed)
    with Engine(config, device="sim") as engine:
        t0 = time.perf_counter()
        report = engine.run(trace)
        engine.device.synchronize()
        seconds = time.perf_counter() - t0
    forwards = sum(n for (_, _), n in report.published.items())
    return seconds, forwards


def _sanitized(backend: str, algorithm: str, requests: int, seed: int) -> dict[str, Any]:
    from warcore.audit.sanitizer import sanitize

    report = sanitize(backend, algorithm, requests=requests, seed=seed)
    return {
        "verdict": report.verdict,
        "forwards": report.forwards,
        "checked": report.checked,
        "clean_s": report.run_s.get("clean"),
        "poisoned_s": report.run_s.get("poisoned"),
        "bindings_s": report.run_s.get("bindings"),
        "elapsed_s": report.elapsed_s,
    }


def measure(
    combinations: tuple[tuple[str, str], ...] = COMBINATIONS,
    requests: int = 10,
    repeat: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    from warcore.core import get_plugin_manager, get_registry

    registry = get_registry(get_plugin_manager())
    combos = [
        (b, a) for b, a in combinations if b in registry.backends and a in registry.algorithms
    ]
    skipped = [f"{b}/{a}" for b, a in combinations if (b, a) not in combos]
    samples = _rounds(combos, requests, repeat, seed)
    return {
        "model": {
            "device": "sim",
            "config": "warcore.audit.sanitizer.engine_config (serial loop, float64, max_running 8)",
            "requests": requests,
            "seed": seed,
            "repeat": repeat,
        },
        "combinations": [_row(b, a, s) for (b, a), s in samples.items()],
        "skipped": skipped,
        "machine": machine_info("sim"),
    }


Samples = dict[str, list[Any]]
"""One combination's samples: ``plain`` (seconds, forwards) and ``sanitize`` (dicts) runs."""


def _rounds(
    combos: list[tuple[str, str]], requests: int, repeat: int, seed: int
) -> dict[tuple[str, str], Samples]:
    """A discarded warm-up round, then ``repeat`` rounds, each in an order rotated by one."""
    tasks = [(b, a, kind) for b, a in combos for kind in ("plain", "sanitize")]
    for b, a, kind in tasks:  # warm-up round, discarded
        _plain_run(b, a, requests, seed) if kind == "plain" else _sanitized(b, a, requests, seed)
    samples: dict[tuple[str, str], Samples] = {c: {"plain": [], "sanitize": []} for c in combos}
    for r in range(repeat):
        k = r % len(tasks)
        for b, a, kind in tasks[k:] + tasks[:k]:
            if kind == "plain":
                samples[(b, a)]["plain"].append(_plain_run(b, a, requests, seed))
            else:
                samples[(b, a)]["sanitize"].append(_sanitized(b, a, requests, seed))
    return samples


def _row(backend: str, algorithm: str, s: Samples) -> dict[str, Any]:
    """One combination's result: milliseconds per forward, and ratios to the plain run."""
    plain_ms = [sec / n * 1e3 for sec, n in s["plain"] if n]
    san = s["sanitize"]
    per_forward = {
        key: [x[f"{key}_s"] / x["forwards"] * 1e3 for x in san if x[f"{key}_s"] and x["forwards"]]
        for key in ("clean", "poisoned", "bindings", "elapsed")
    }
    ratios = {
        key: [
            x[f"{key}_s"] / x["forwards"] * 1e3 / (sec / n * 1e3)
            for x, (sec, n) in zip(san, s["plain"], strict=True)
            if x[f"{key}_s"] and x["forwards"] and n
        ]
        for key in ("clean", "poisoned", "bindings")
    }
    return {
        "backend": backend,
        "algorithm": algorithm,
        "verdict": san[-1]["verdict"],
        "forwards": san[-1]["forwards"],
        "checked": san[-1]["checked"],
        "plain_ms_per_forward": summarise(plain_ms),
        "clean_ms_per_forward": summarise(per_forward["clean"]),
        "poisoned_ms_per_forward": summarise(per_forward["poisoned"]),
        "bindings_ms_per_forward": summarise(per_forward["bindings"]),
        "sanitize_total_ms_per_forward": summarise(per_forward["elapsed"]),
        "clean_ratio_to_plain": summarise(ratios["clean"]),
        "poisoned_ratio_to_plain": summarise(ratios["poisoned"]),
        "bindings_ratio_to_plain": summarise(ratios["bindings"]),
    }


def table(result: dict[str, Any]) -> str:
    m = result["model"]
    head = (
        f"sanitizer: sim, serial loop, {m['requests']} requests; ms per forward, median (min) "
        f"of {m['repeat']} rounds; ratios within a round"
    )
    rows = []
    for r in result["combinations"]:

        def cell(key: str, spec: str = ".2f", row: dict[str, Any] = r) -> str:
            return f"{row[key]['median']:{spec}} ({row[key]['min']:{spec}})"

        rows.append(
            [
                f"{r['backend']}/{r['algorithm']}",
                f"{r['checked']}/{r['forwards']}",
                cell("plain_ms_per_forward"),
                cell("clean_ms_per_forward"),
                cell("poisoned_ms_per_forward"),
                cell("poisoned_ratio_to_plain"),
                cell("bindings_ms_per_forward"),
                cell("sanitize_total_ms_per_forward"),
                r["verdict"],
            ]
        )
    lines = [
        head,
        format_table(
            [
                "combination",
                "checked",
                "plain",
                "clean",
                "poisoned",
                "x plain",
                "bindings",
                "all",
                "verdict",
            ],
            rows,
        ),
    ]
    if result["skipped"]:
        lines.append(f"skipped (not installed): {', '.join(result['skipped'])}")
    return "\n".join(lines)
