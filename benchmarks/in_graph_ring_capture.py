"""Capture cost of the in-graph event ring against the persistent event (docs/event-lifetime.md).

Builds the reference engine (default model, sim device, sglang #31072's late copy consumer, so
the derived ring is 2 deep for the target and 6 for EAGLE's draft runner) with
``in_graph_event="persistent"`` and ``"ring"``, and eagerly (``use_graphs=False``: no capture,
the rest of the build), interleaved round by round after a warm-up round. Capture time is the
build time minus the eager build's, within a round; the ratio is ring / persistent per round.

    .venv/bin/python benchmarks/in_graph_ring_capture.py [rounds]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from warcore.engine import Engine, EngineConfig

SETTINGS: dict[str, dict[str, object]] = {
    "eager": {"use_graphs": False},
    "persistent": {},
    "ring": {"in_graph_event": "ring"},
}


def build(algorithm: str, options: dict[str, object]) -> tuple[float, int]:
    config = EngineConfig(algorithm=algorithm, copy_wait="after-next-launch", **options)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    with Engine(config, device="sim") as engine:
        elapsed = time.perf_counter() - t0
        groups = [engine.target, getattr(engine.step_worker, "draft", None)]
        graphs = sum(g.graph_count for grp in groups if grp for g in grp.graphs.values())
    return elapsed, graphs


def main(rounds: int) -> None:
    result: dict[str, object] = {}
    for algorithm in ("none", "eagle"):
        for options in SETTINGS.values():
            build(algorithm, options)  # warm-up: first-use costs of torch and the device
        capture: dict[str, list[float]] = {"persistent": [], "ring": []}
        ratios: list[float] = []
        graphs: dict[str, int] = {}
        for r in range(rounds):
            names = list(SETTINGS)
            names = names[r % 3 :] + names[: r % 3]
            times = {}
            for name in names:
                times[name], graphs[name] = build(algorithm, SETTINGS[name])
            for name in capture:
                capture[name].append((times[name] - times["eager"]) * 1e3)
            ratios.append(capture["ring"][-1] / capture["persistent"][-1])
        result[algorithm] = {
            "graphs": graphs,
            "capture_ms_median": {k: statistics.median(v) for k, v in capture.items()},
            "ring_over_persistent_capture": {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            },
        }
    print(json.dumps({"rounds": rounds, "results": result}, indent=2))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
