"""Fences compared on the reference engine: ``warcore bench overlap`` and ``warcore bench sweep``.

Both run the same seeded request trace through the reference engine with the serial loop, the
coarse fence, the fine fence and no fence (unsafe: the upper bound of overlap), and read the
forward stream's timeline from the device's work-item spans (see
:mod:`warcore.audit.trace_export`).

The model, stated in every result, because the tiny CPU forward is not a GPU's:

* ``modelled_layer_s``: each model layer also takes this much wall time on the forward stream
  without using a CPU (sim only), as a GPU kernel leaves the host free; the layer's own CPU
  compute (~1.5-2.5 ms here) comes on top;
* ``schedule_work_s``: the scheduler's device work per step, a sleep on the schedule stream on
  sim (a copy engine's H2D copy uses no SM), a real pinned H2D copy on CUDA. It is given as a
  fraction of the forward's time F, which a calibration run measures first (fine fence, no
  scheduler work: the mean span of a forward on the forward stream, or on CUDA, which reports no
  spans, the wall time per step).

Configurations are interleaved round by round (the order rotates each round) after a warm-up
round, and every ratio is taken inside one round; results give the median and the minimum.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from warcore.bench._common import format_table, machine_info, summarise

if TYPE_CHECKING:
    from warcore.audit.trace_export import Timeline
    from warcore.engine import EngineConfig, Request

__all__ = [
    "SWEEP_FENCES",
    "RunSample",
    "Settings",
    "Variant",
    "calibrate",
    "measure_overlap",
    "measure_sweep",
    "overlap_table",
    "run_variant",
    "sweep_table",
]


@dataclass(frozen=True)
class Variant:
    name: str
    fence: str
    loop: str
    backend: str | None = None
    """``None``: the benchmark's backend."""
    staging: str = "ring"
    """How forwards stage their host inputs (``EngineConfig.staging``)."""
    copy_wait: str = "none"
    """A second consumer of the read-done event (``EngineConfig.copy_wait``)."""
    in_graph_event: str = "persistent"
    """The graphs' record-node event (``EngineConfig.in_graph_event``)."""


SERIAL = Variant("serial", "coarse", "serial")
COARSE = Variant("coarse", "coarse", "overlap")
FINE = Variant("fine", "fine", "overlap")
UNSAFE = Variant("unsafe", "none", "overlap")
# torch_native declares nothing for EXTEND, so its prefill steps publish nothing and take the
# coarse fence; trtllm_mha snapshots the page table before the replay (PRE_REPLAY).
FINE_TORCH_NATIVE = Variant("fine/torch_native", "fine", "overlap", "torch_native")
# The fine fence a second time in every round: its ratio to the first is the noise floor of
# every other ratio (an A/A control), which on a shared 2-vCPU machine is not small.
FINE_AGAIN = Variant("fine A/A", "fine", "overlap")
# The fine fence with fresh host tensors every forward instead of the persistent staging ring.
FINE_FRESH = Variant("fine/fresh staging", "fine", "overlap", staging="fresh")
# sglang #31072's late copy consumer, with the persistent in-graph event (it binds to the next
# forward's record) and with the ring of captured nodes (depth 2: two graphs per bucket, it
# binds in time); their ratio is what the ring costs at capture and at replay.
FINE_LATE = Variant("fine/late copy, persistent", "fine", "overlap", copy_wait="after-next-launch")
FINE_LATE_RING = Variant(
    "fine/late copy, in-graph ring",
    "fine",
    "overlap",
    copy_wait="after-next-launch",
    in_graph_event="ring",
)
OVERLAP_VARIANTS = (
    SERIAL,
    COARSE,
    FINE,
    UNSAFE,
    FINE_TORCH_NATIVE,
    FINE_FRESH,
    FINE_LATE,
    FINE_LATE_RING,
    FINE_AGAIN,
)
SWEEP_FENCES = (COARSE, FINE, UNSAFE)

DEFAULT_BACKEND = "trtllm_mha"
DEFAULT_LAYER_MS = 4.0
DEFAULT_SCHED_FRACTION = 0.4
DEFAULT_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class Settings:
    """What to measure: the trace, the engine and the model of device time."""

    device: str = "sim"
    backend: str = DEFAULT_BACKEND
    requests: int = 24
    seed: int = 0
    repeat: int = 11
    layer_ms: float = DEFAULT_LAYER_MS
    """Modelled device time per layer, ms (sim only)."""
    dtype: str = "float32"
    quiet: bool = False
    """No progress line on stderr."""
    sched_frac: float = DEFAULT_SCHED_FRACTION
    """Overlap: scheduler device work per step, as a fraction of the forward's time."""
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    """Sweep: the fractions measured, ascending."""


@dataclass(frozen=True)
class RunSample:
    """One engine run, measured."""

    tokens: int
    elapsed_s: float
    tokens_per_s: float
    steps: int
    """Steps that launched a forward."""
    forward_ms: float | None
    """Mean span of a forward on the forward stream (first item start to last item end)."""
    idle_ms: float | None
    """Mean idle time of the forward stream between consecutive forwards."""
    step_ms: float
    """Forward-stream wall time per step (first forward's start to last one's end, over
    steps); on a device without spans, the run's wall time per step."""
    schedule_ms: float | None
    """Mean scheduler device work per write launch (``schedule_write`` + ``schedule_copy``)."""
    ideal_ms: float | None
    """Mean over forwards of max(forward span, mean scheduler work): perfect overlap."""
    barriers: dict[str, int]
    published: dict[str, int]
    matches_oracle: bool | None
    build_s: float = 0.0
    """Engine construction (model, pools, graph capture, ending with a device sync)."""
    graphs: int = 0
    """Captured graphs the engine holds (every runner, mode and bucket; ring slots too)."""
    reserved_mb: float | None = None
    """CUDA only: memory the caching allocator reserved when the engine was built (weights,
    pools and the graphs' private memory pools); ``None`` on sim."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Timings(NamedTuple):
    """A run's stream timings from its trace (ms)."""

    forward_ms: float | None
    idle_ms: float | None
    """The mean gap between forwards."""
    step_ms: float
    schedule_ms: float | None
    """The scheduler's write per step."""
    ideal_ms: float | None
    """The mean of the longer of a forward and that write: what a perfect overlap takes."""


def _timings(tl: Timeline, elapsed_s: float, steps: int) -> _Timings:
    from warcore.audit.trace_export import SCHEDULE_STREAM

    fw = [f for f in tl.forwards if f.items]
    gaps = tl.forward_gaps()
    writes = [s for s in tl.streams.get(SCHEDULE_STREAM, []) if s.label == "schedule_write"]
    sched_ms = tl.busy(SCHEDULE_STREAM) / len(writes) * 1e3 if writes else None
    idle_ms = statistics.fmean(gaps) * 1e3 if gaps else None
    if not fw:
        return _Timings(None, idle_ms, elapsed_s * 1e3 / max(1, steps), sched_ms, None)
    spans = [(f.end - f.start) * 1e3 for f in fw]
    step_ms = (fw[-1].end - fw[0].start) * 1e3 / max(1, steps)
    ideal = statistics.fmean(max(s, sched_ms or 0.0) for s in spans)
    return _Timings(statistics.fmean(spans), idle_ms, step_ms, sched_ms, ideal)


def run_variant(
    base: EngineConfig,
    variant: Variant,
    trace: list[Request],
    device: str,
    oracle: dict[int, list[int]] | None = None,
) -> tuple[RunSample, dict[int, list[int]]]:
    """Run ``trace`` once with ``variant`` on a fresh engine; the sample and the outputs."""
    from warcore.audit.trace_export import Timeline, TraceRecorder
    from warcore.engine import Engine

    cfg = replace(
        base,
        fence=variant.fence,  # type: ignore[arg-type]
        loop=variant.loop,  # type: ignore[arg-type]
        backend=variant.backend or base.backend,
        staging=variant.staging,  # type: ignore[arg-type]
        copy_wait=variant.copy_wait,  # type: ignore[arg-type]
        in_graph_event=variant.in_graph_event,  # type: ignore[arg-type]
    )
    recorder = TraceRecorder()
    reserved = _reserved_mb(device)
    t0 = time.perf_counter()
    # Engine construction finishes graph capture; closing drops its decision-cache entries.
    with Engine(cfg, device=device) as engine:
        build_s = time.perf_counter() - t0
        after = _reserved_mb(device)
        graphs = sum(
            g.graph_count
            for group in (engine.target, getattr(engine.step_worker, "draft", None))
            if group is not None
            for g in group.graphs.values()
        )
        report = engine.run(trace, observer=recorder)
    steps = sum(report.forwards.values())
    sample = RunSample(
        tokens=report.tokens,
        elapsed_s=report.elapsed_s,
        tokens_per_s=report.tokens_per_s,
        steps=steps,
        **_timings(Timeline(recorder), report.elapsed_s, steps)._asdict(),
        barriers=dict(report.barriers),
        published={
            f"{mode.name}:{point.value}": n
            for (mode, point), n in sorted(
                report.published.items(), key=lambda kv: (kv[0][0].name, kv[0][1].value)
            )
        },
        matches_oracle=None if oracle is None else report.outputs == oracle,
        build_s=build_s,
        graphs=graphs,
        reserved_mb=None if reserved is None or after is None else after - reserved,
    )
    return sample, report.outputs


def _reserved_mb(device: str) -> float | None:
    if device != "cuda":
        return None
    import torch

    return torch.cuda.memory_reserved() / 2**20


def calibrate(base: EngineConfig, trace: list[Request], device: str) -> tuple[float, str]:
    """The forward's time F in seconds (fine fence, no scheduler work), after a warm-up run,
    and how it was measured."""
    cfg = replace(base, schedule_work_s=0.0)
    run_variant(cfg, FINE, trace, device)  # warm-up: first-use costs of torch and the device
    sample, _ = run_variant(cfg, FINE, trace, device)
    if sample.forward_ms is not None:
        return sample.forward_ms / 1e3, "mean forward span on the forward stream"
    return sample.step_ms / 1e3, "wall time per step (the device reports no spans)"


def _base_config(settings: Settings) -> EngineConfig:
    import torch

    from warcore.engine import EngineConfig, ModelConfig

    layer_s = settings.layer_ms / 1e3
    if settings.device != "sim" and layer_s:
        layer_s = 0.0  # a real device's kernels take their own time; nothing to model
    return EngineConfig(
        model=ModelConfig(dtype=getattr(torch, settings.dtype)),
        backend=settings.backend,
        modelled_layer_s=layer_s,
    )


def _model_info(base: EngineConfig, settings: Settings, trace: list[Request]) -> dict[str, Any]:
    return {
        "device": settings.device,
        "backend": base.backend,
        "algorithm": base.algorithm,
        "dtype": settings.dtype,
        "layers": base.model.layers,
        "modelled_layer_s": base.modelled_layer_s,
        "use_graphs": base.use_graphs,
        "requests": len(trace),
        "seed": settings.seed,
        "max_new_tokens_total": sum(r.max_new_tokens for r in trace),
        "repeat": settings.repeat,
    }


def _progress(enabled: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        if enabled:
            sys.stderr.write(f"\r\033[K{text}")
            sys.stderr.flush()

    return say


def _rotated(items: Sequence[Variant], k: int) -> list[Variant]:
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def _ratios(
    rounds: list[dict[str, RunSample]], name: str, ref: str, field: str
) -> dict[str, float] | None:
    vals = []
    for rnd in rounds:
        a, b = getattr(rnd[name], field), getattr(rnd[ref], field)
        if a is not None and b:
            vals.append(a / b)
    return summarise(vals) if vals else None


def _stat(samples: Sequence[RunSample], field: str) -> dict[str, float] | None:
    vals = [getattr(s, field) for s in samples if getattr(s, field) is not None]
    return summarise(vals) if vals else None


# -- overlap ---------------------------------------------------------------------------------


class _Start(NamedTuple):
    """What both benchmarks start from."""

    say: Callable[[str], None]
    trace: list[Request]
    base: EngineConfig
    forward_s: float
    """The forward's time F (:func:`calibrate`)."""
    how: str
    """How F was measured."""


def _start(settings: Settings, name: str) -> _Start:
    """The progress line, the trace, the base configuration, and F calibrated on them."""
    from warcore.engine import synthetic_trace

    say = _progress(sys.stderr.isatty() and not settings.quiet)
    trace = synthetic_trace(settings.requests, seed=settings.seed)
    base = _base_config(settings)
    say(f"{name}: calibrating the forward time")
    forward_s, how = calibrate(base, trace, settings.device)
    return _Start(say, trace, base, forward_s, how)


def measure_overlap(settings: Settings) -> dict[str, Any]:
    say, trace, base, forward_s, how = _start(settings, "overlap")
    base = replace(base, schedule_work_s=settings.sched_frac * forward_s)
    say("overlap: oracle and warm-up round")
    _, oracle = run_variant(base, SERIAL, trace, settings.device)
    for v in OVERLAP_VARIANTS:
        run_variant(base, v, trace, settings.device)
    rounds: list[dict[str, RunSample]] = []
    for r in range(settings.repeat):
        rnd: dict[str, RunSample] = {}
        for v in _rotated(OVERLAP_VARIANTS, r):
            say(f"overlap: round {r + 1}/{settings.repeat}: {v.name}")
            rnd[v.name], _ = run_variant(base, v, trace, settings.device, oracle)
        rounds.append(rnd)
    say("")
    return {
        "model": _model_info(base, settings, trace)
        | {
            "forward_s": forward_s,
            "forward_s_measured_as": how,
            "schedule_work_fraction": settings.sched_frac,
            "schedule_work_s": base.schedule_work_s,
        },
        "variants": {v.name: _overlap_variant(v, base, rounds) for v in OVERLAP_VARIANTS},
        "checks": {
            f"fine_over_{key}_tokens_per_s": _ratios(rounds, FINE.name, other, "tokens_per_s")
            for key, other in (
                ("unsafe", UNSAFE.name),
                ("coarse", COARSE.name),
                ("fine_fresh_staging", FINE_FRESH.name),
                ("fine_again", FINE_AGAIN.name),
            )
        }
        | {
            f"in_graph_ring_over_persistent_{field}": _ratios(
                rounds, FINE_LATE_RING.name, FINE_LATE.name, field
            )
            for field in ("tokens_per_s", "step_ms", "build_s")
        },
        "machine": machine_info(settings.device),
    }


def _overlap_variant(
    v: Variant, base: EngineConfig, rounds: list[dict[str, RunSample]]
) -> dict[str, Any]:
    """One variant's samples over the rounds, and its ratios to the fine fence."""
    samples = [rnd[v.name] for rnd in rounds]
    return {
        "fence": v.fence,
        "loop": v.loop,
        "backend": v.backend or base.backend,
        "staging": v.staging,
        "tokens_per_s": _stat(samples, "tokens_per_s"),
        "tokens_per_s_ratio_to_fine": _ratios(rounds, v.name, FINE.name, "tokens_per_s"),
        "idle_ms_per_gap": _stat(samples, "idle_ms"),
        "idle_ratio_to_fine": _ratios(rounds, v.name, FINE.name, "idle_ms"),
        "step_ms": _stat(samples, "step_ms"),
        "forward_ms": _stat(samples, "forward_ms"),
        "copy_wait": v.copy_wait,
        "in_graph_event": v.in_graph_event,
        "build_s": _stat(samples, "build_s"),
        "graphs": samples[-1].graphs,
        "reserved_mb": _stat(samples, "reserved_mb"),
        "barriers": samples[-1].barriers,
        "published": samples[-1].published,
        "runs_differing_from_serial": sum(1 for s in samples if s.matches_oracle is False),
        "runs": [s.as_dict() for s in samples],
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


_OVERLAP_COLUMNS = [
    "variant",
    "tokens/s",
    "x fine",
    "idle ms/gap",
    "x fine",
    "step ms",
    "barriers",
    "wrong runs",
]


def _overlap_row(name: str, r: dict[str, Any]) -> list[str]:
    tps, ratio = r["tokens_per_s"], r["tokens_per_s_ratio_to_fine"]
    idle, iratio = r["idle_ms_per_gap"], r["idle_ratio_to_fine"]
    return [
        name,
        f"{tps['median']:.0f} ({tps['min']:.0f})",
        f"{ratio['median']:.3f} ({ratio['min']:.3f})",
        "-" if idle is None else f"{idle['median']:.2f} ({idle['min']:.2f})",
        "-" if iratio is None else f"{iratio['median']:.1f}",
        f"{r['step_ms']['median']:.1f}",
        ", ".join(f"{k} {v}" for k, v in sorted(r["barriers"].items())) or "-",
        str(r["runs_differing_from_serial"]),
    ]


def _model_head(kind: str, m: dict[str, Any]) -> str:
    """A table's first line: what served which trace, and the modelled forward time F."""
    return (
        f"{kind}: {m['device']}, backend {m['backend']}, {m['requests']} requests (seed "
        f"{m['seed']}), {m['layers']} layers x {m['modelled_layer_s'] * 1e3:g} ms modelled, "
        f"F = {m['forward_s'] * 1e3:.1f} ms"
    )


def overlap_table(result: dict[str, Any]) -> str:
    m = result["model"]
    head = (
        f"{_model_head('overlap', m)}, scheduler work {m['schedule_work_s'] * 1e3:.1f} ms "
        f"({m['schedule_work_fraction']:.0%} of F); median (min) of {m['repeat']} rounds"
    )
    rows = [_overlap_row(name, r) for name, r in result["variants"].items()]
    table = format_table(_OVERLAP_COLUMNS, rows)
    c = result["checks"]
    tail = "\n".join(
        f"{label} tokens/s, per round: median {r['median']:.3f}, min {r['min']:.3f}, "
        f"max {r['max']:.3f}"
        for label, r in (
            ("fine / unsafe", c["fine_over_unsafe_tokens_per_s"]),
            ("fine / coarse", c["fine_over_coarse_tokens_per_s"]),
            ("fine (ring) / fine (fresh staging)", c["fine_over_fine_fresh_staging_tokens_per_s"]),
            (
                "in-graph ring / persistent (late copy)",
                c["in_graph_ring_over_persistent_tokens_per_s"],
            ),
            ("fine / fine A/A (noise)", c["fine_over_fine_again_tokens_per_s"]),
        )
        if r is not None
    )
    ring, persistent = result["variants"][FINE_LATE_RING.name], result["variants"][FINE_LATE.name]
    build = c["in_graph_ring_over_persistent_build_s"]
    if build is not None:
        tail += (
            f"\nin-graph ring / persistent (late copy) engine build time, per round: median "
            f"{build['median']:.3f}, min {build['min']:.3f}, max {build['max']:.3f}; graphs "
            f"{ring['graphs']} / {persistent['graphs']}"
        )
    return "\n".join([head, table, tail])


# -- sweep -----------------------------------------------------------------------------------


def measure_sweep(settings: Settings) -> dict[str, Any]:
    say, trace, base, forward_s, how = _start(settings, "sweep")
    fractions = settings.fractions
    say("sweep: warm-up")
    for v in SWEEP_FENCES:
        run_variant(
            replace(base, schedule_work_s=forward_s * fractions[-1]), v, trace, settings.device
        )
    # samples[point][round][variant]
    samples: list[list[dict[str, RunSample]]] = [[] for _ in fractions]
    for r in range(settings.repeat):
        for i, frac in enumerate(fractions):
            cfg = replace(base, schedule_work_s=forward_s * frac)
            rnd: dict[str, RunSample] = {}
            for v in _rotated(SWEEP_FENCES, r + i):
                say(f"sweep: round {r + 1}/{settings.repeat}, work {frac:.0%} of F: {v.name}")
                rnd[v.name], _ = run_variant(cfg, v, trace, settings.device)
            samples[i].append(rnd)
    say("")
    points = [
        _sweep_point(frac, forward_s, rounds)
        for frac, rounds in zip(fractions, samples, strict=True)
    ]
    return {
        "model": _model_info(base, settings, trace)
        | {"forward_s": forward_s, "forward_s_measured_as": how},
        "points": points,
        "checks": _sweep_checks(points),
        "machine": machine_info(settings.device),
    }


def _sweep_point(
    frac: float, forward_s: float, rounds: list[dict[str, RunSample]]
) -> dict[str, Any]:
    """One amount of scheduler work: each fence's samples over the rounds, and the ratios."""
    flat = [s for rnd in rounds for s in rnd.values()]
    fences = {}
    for v in SWEEP_FENCES:
        runs = [rnd[v.name] for rnd in rounds]
        fences[v.name] = {
            "fence": v.fence,
            "step_ms": _stat(runs, "step_ms"),
            "tokens_per_s": _stat(runs, "tokens_per_s"),
            "idle_ms_per_gap": _stat(runs, "idle_ms"),
            "runs": [s.as_dict() for s in runs],
        }
    return {
        "fraction": frac,
        "schedule_work_ms": forward_s * frac * 1e3,
        "ideal_step_ms": _stat(flat, "ideal_ms"),
        "fences": fences,
        "fine_over_coarse_tokens_per_s": _ratios(rounds, FINE.name, COARSE.name, "tokens_per_s"),
        "fine_over_unsafe_tokens_per_s": _ratios(rounds, FINE.name, UNSAFE.name, "tokens_per_s"),
        "fine_over_coarse_step_ms": _ratios(rounds, FINE.name, COARSE.name, "step_ms"),
    }


def _sweep_checks(points: list[dict[str, Any]]) -> dict[str, Any]:
    ahead = [
        p["fine_over_coarse_tokens_per_s"]["median"] > 1.0
        for p in points
        if p["fraction"] >= 0.2 and p["fine_over_coarse_tokens_per_s"]
    ]
    unsafe = [p["fine_over_unsafe_tokens_per_s"] for p in points]
    return {
        "fine_ahead_of_coarse_from_20_percent": all(ahead) if ahead else None,
        "fine_over_unsafe_tokens_per_s_min_median": min(
            (r["median"] for r in unsafe if r), default=None
        ),
    }


def sweep_table(result: dict[str, Any]) -> str:
    m = result["model"]
    head = f"{_model_head('sweep', m)}; step ms per forward, median of {m['repeat']} rounds"
    rows = []
    for p in result["points"]:
        f = p["fences"]
        foc, fou = p["fine_over_coarse_tokens_per_s"], p["fine_over_unsafe_tokens_per_s"]
        rows.append(
            [
                f"{p['fraction']:.0%}",
                f"{p['schedule_work_ms']:.1f}",
                _fmt(p["ideal_step_ms"] and p["ideal_step_ms"]["median"], ".1f"),
                *(f"{f[v.name]['step_ms']['median']:.1f}" for v in SWEEP_FENCES),
                "-" if foc is None else f"{foc['median']:.3f} ({foc['min']:.3f})",
                "-" if fou is None else f"{fou['median']:.3f} ({fou['min']:.3f})",
            ]
        )
    table = format_table(
        [
            "work/F",
            "work ms",
            "ideal",
            *(v.name for v in SWEEP_FENCES),
            "fine/coarse tok/s",
            "fine/unsafe tok/s",
        ],
        rows,
    )
    c = result["checks"]
    ahead = c["fine_ahead_of_coarse_from_20_percent"]
    tail = f"fine ahead of coarse (median tokens/s) at every point with work >= 20% of F: {ahead}"
    return "\n".join([head, table, tail])
