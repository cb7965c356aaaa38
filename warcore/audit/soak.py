"""``warcore soak``: a long random run of the overlap engine, checked two ways.

Segment after segment, a fresh seeded trace (arrivals, mixed lengths, finishes and slot reuse)
is served by the overlap engine with the fine fence under one backend x algorithm combination
(rotating through every combination the reference engine runs); its tokens are compared with
plain serial greedy decoding of the same requests, and the sanitizer checks the same trace. The
run stops once the overlap engine has taken ``steps`` steps. Any token mismatch or violation
makes the exit status 1.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warcore.audit.sanitizer import SanitizeReport
    from warcore.core import WarcorePluginManager
    from warcore.engine import Engine, Request
    from warcore.engine.hicache import PrefixCacheStats
    from warcore.engine.report import RunReport

__all__ = ["SoakReport", "soak"]


@dataclass
class SoakReport:
    steps: int = 0
    requests: int = 0
    segments: int = 0
    forwards_checked: int = 0
    violations: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    per_combination: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0
    hicache: bool = False
    """The overlap engines ran with the host KV tier (``hicache``) on."""
    prefix_lookups: int = 0
    prefix_hits: int = 0
    tokens_shared: int = 0
    tokens_loaded: int = 0
    device_evictions: int = 0
    copies_checked: int = 0

    def add_prefix_cache(self, where: str, pc: PrefixCacheStats) -> None:
        """Count one segment's prefix cache; each unordered copy is a violation."""
        self.prefix_lookups += pc.lookups
        self.prefix_hits += pc.hits
        self.tokens_shared += pc.tokens_shared
        self.tokens_loaded += pc.tokens_loaded
        self.device_evictions += pc.device_evictions
        self.copies_checked += pc.copies_checked
        self.violations += [f"{where}: {u}" for u in pc.unordered]

    @property
    def clean(self) -> bool:
        return not (self.violations or self.mismatches or self.errors)

    def format(self) -> str:
        combos = ", ".join(f"{name} x{n}" for name, n in sorted(self.per_combination.items()))
        lines = [
            f"soak: {self.steps} steps, {self.requests} requests, {self.segments} segments in "
            f"{self.elapsed_s:.0f} s",
            f"  combinations      {combos}",
            f"  sanitizer         {self.forwards_checked} forwards checked, "
            f"{len(self.violations)} violations",
            f"  overlap vs serial {len(self.mismatches)} token mismatches",
        ]
        if self.hicache:
            lines.append(
                f"  prefix cache      {self.prefix_hits}/{self.prefix_lookups} prefills hit, "
                f"{self.tokens_shared} tokens shared on device, {self.tokens_loaded} loaded "
                f"back, {self.device_evictions} device blocks evicted, {self.copies_checked} "
                "copies checked for order"
            )
        lines += [f"  VIOLATION {v}" for v in self.violations[:5]]
        lines += [f"  MISMATCH {m}" for m in self.mismatches[:5]]
        lines += [f"  ERROR {e}" for e in self.errors[:5]]
        lines.append("  verdict           " + ("clean" if self.clean else "FAILED"))
        return "\n".join(lines)


def soak(
    steps: int,
    *,
    seed: int = 0,
    requests_per_segment: int = 24,
    pm: WarcorePluginManager | None = None,
    progress: bool = False,
    hicache: bool = False,
) -> SoakReport:
    """``hicache``: the overlap engines run with the host KV tier on, over traces whose prompts
    share prefixes (``prompts="shared"``), so load-backs happen; the oracle stays plain serial
    decoding without the tier, and each copy the tier makes that is not ordered behind the
    forwards touching its slots is a violation."""
    from warcore.audit.sanitizer import combinations, sanitize
    from warcore.core import get_plugin_manager
    from warcore.engine import Engine, EngineConfig

    if steps < 1:
        raise ValueError(f"--steps must be at least 1, got {steps}")
    if requests_per_segment < 1:  # a segment without requests takes no step: it never ends
        raise ValueError(f"--requests must be at least 1, got {requests_per_segment}")
    pm = pm if pm is not None else get_plugin_manager()
    combos = [c for c in combinations(pm) if c.skipped is None]
    report = SoakReport(hicache=hicache)
    flags: tuple[tuple[str, bool | int | str], ...] = (("hicache", True),) if hicache else ()
    engines: dict[tuple[str, str], Engine] = {}
    plain: Engine | None = None
    start = time.perf_counter()
    try:
        plain = Engine(EngineConfig(loop="serial"), device="sim", pm=pm)
        while report.steps < steps:
            combo = combos[report.segments % len(combos)]
            trace = _segment_trace(seed + report.segments, requests_per_segment, hicache)
            key = (combo.backend, combo.algorithm)
            if key not in engines:
                slots = HICACHE_SLOTS if hicache else EngineConfig.num_slots
                config = EngineConfig(
                    backend=combo.backend, algorithm=combo.algorithm, flags=flags, num_slots=slots
                )
                engines[key] = Engine(config, device="sim", pm=pm)
            name = f"{combo.backend}/{combo.algorithm}"
            expected = plain.run(trace).outputs
            served = engines[key].run(trace)
            audit = sanitize(combo.backend, combo.algorithm, pm=pm, requests=trace)
            _record(report, name, len(trace), expected, served, audit)
            if progress:
                print(f"  {report.steps}/{steps} steps ({name})", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
        if plain is not None:
            plain.close()
    report.elapsed_s = time.perf_counter() - start
    return report


def _record(
    report: SoakReport,
    name: str,
    requests: int,
    expected: dict[int, list[int]],
    served: RunReport,
    audit: SanitizeReport,
) -> None:
    """One segment's outcome in ``report``: its tokens against the serial oracle's, the
    engine's stop, the prefix cache's figures and the sanitizer's verdict."""
    report.steps += served.steps
    report.requests += requests
    report.segments += 1
    report.per_combination[name] += 1
    segment = f"{name} segment {report.segments}"
    if served.stopped is not None:
        report.errors.append(f"{segment}: {served.stopped}")
    wrong = sorted(rid for rid, out in served.outputs.items() if out != expected[rid])
    if wrong:
        report.mismatches.append(f"{segment}: requests {wrong}")
    if served.prefix_cache is not None:
        report.add_prefix_cache(segment, served.prefix_cache)
    report.forwards_checked += audit.checked
    if audit.violation is not None:
        report.violations.append(f"segment {report.segments}: {audit.violation.describe()}")
    if audit.error is not None:
        report.errors.append(f"{segment}: {audit.error}")


HICACHE_SLOTS = 256
"""The KV pool of the soak's engines with the host KV tier on: small enough that the prefix
cache evicts blocks from the device, so hits load them back from host memory too."""


def _segment_trace(seed: int, n: int, hicache: bool = False) -> list[Request]:
    """Traces differ in arrival pressure too: some segments queue, some trickle. With the host
    KV tier, prompts share prefixes (the tier has something to load back)."""
    from warcore.engine import synthetic_trace

    gap = (0.3, 1.5, 3.0)[seed % 3]
    prompts = "shared" if hicache else "random"
    return synthetic_trace(n, seed=seed, output_len=(1, 24), mean_gap_steps=gap, prompts=prompts)
