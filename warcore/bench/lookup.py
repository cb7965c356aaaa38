"""Micro-benchmark: what a per-replay decision costs, next to a method call and a pluggy call.

DESIGN §3 promises that the per-replay hot path is a lookup in a precomputed table, never a
hook call. This measures, in one process and one run, the three things that claim compares:

* ``lookup``: ``cache[key].record_point`` on a warm :class:`~warcore.core.DecisionCache`, with
  the key built once beforehand (as a runner does at capture);
* ``direct``: a method call on a small object (the floor for "doing anything" per replay);
* ``pluggy``: ``pm.hook.warcore_shared_read_boundary(...)`` through the installed plugins.

``warcore bench lookup`` runs it (:mod:`warcore.cli.bench`); ``--json FILE`` writes the
numbers. Each is timeit's best of ``--repeat`` runs of ``--number`` calls, in ns per call.
"""

from __future__ import annotations

import platform
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from warcore.core import (
    BoundaryContext,
    DecisionKey,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
)

__all__ = ["BenchResult", "measure", "table"]

_BACKEND = "trtllm_mha"
_MODE = ForwardMode.DECODE


class _Runner:
    """Stands in for a runner object that already knows its record point."""

    def __init__(self, point: RecordPoint) -> None:
        self._point = point

    def record_point(self) -> RecordPoint:
        return self._point


@dataclass(frozen=True)
class BenchResult:
    ns_per_call: dict[str, float]
    number: int
    repeat: int
    hookimpls: tuple[str, ...]

    def ratios(self) -> dict[str, float]:
        base = self.ns_per_call["direct"]
        return {name: ns / base for name, ns in self.ns_per_call.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": "ns per call (best of repeat)",
            "number": self.number,
            "repeat": self.repeat,
            "ns_per_call": self.ns_per_call,
            "ratio_to_direct": self.ratios(),
            "pluggy_hookimpls": list(self.hookimpls),
            "python": platform.python_version(),
            "pluggy": pluggy.__version__,
        }


def _best_ns(stmt: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def measure(
    pm: WarcorePluginManager | None = None, number: int = 100_000, repeat: int = 5
) -> BenchResult:
    """Time the three calls against ``pm`` (the process-wide manager by default)."""
    pm = pm if pm is not None else get_plugin_manager()
    context = BoundaryContext("none")
    cache = get_decision_cache(pm)
    key: DecisionKey = (RunnerKind.DECODE, _BACKEND, _MODE, context, Execution.GRAPH_PLANTED)
    handle = cache.handle(key)  # what a runner does once, at capture
    runner = _Runner(cache[handle].record_point)  # also warms the cache: nothing resolves timed
    hook = pm.hook.warcore_shared_read_boundary
    # Lambdas add one call frame to each measurement alike, so the ratios stay fair.
    timings = {
        "lookup": _best_ns(lambda: cache[handle].record_point, number, repeat),
        "direct": _best_ns(lambda: runner.record_point(), number, repeat),
        "pluggy": _best_ns(
            lambda: hook(backend=_BACKEND, forward_mode=_MODE, context=context, eager=False),
            number,
            repeat,
        ),
    }
    impls = tuple(impl.plugin_name for impl in hook.get_hookimpls())
    return BenchResult(timings, number, repeat, impls)


_LABELS = {
    "lookup": "decision-cache lookup  cache[handle].record_point",
    "direct": "direct method call     runner.record_point()",
    "pluggy": "pluggy hook call       pm.hook.warcore_shared_read_boundary(...)",
}


def table(result: BenchResult) -> str:
    """The result as the text ``warcore bench lookup`` prints."""
    ratios = result.ratios()
    lines = [
        f"best of {result.repeat} x {result.number} calls; pluggy hookimpls: "
        f"{', '.join(result.hookimpls) or '(none)'}",
        f"{'what':<66}  {'ns/call':>8}  {'x direct':>8}",
    ]
    for name, ns in result.ns_per_call.items():
        lines.append(f"{_LABELS[name]:<66}  {ns:>8.1f}  {ratios[name]:>8.2f}")
    return "\n".join(lines)
