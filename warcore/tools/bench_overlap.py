"""Fences compared on the reference engine: ``warcore bench overlap`` and ``warcore bench sweep``.

Both run the same seeded request trace through the reference engine with the serial loop, the
coarse fence, the fine fence and no fence (unsafe: the upper bound of overlap), and read the
forward stream's timeline from the device's work-item spans (see
:mod:`warcore.tools.trace_export`).

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

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from warcore.tools._bench_common import (
    format_table,
    machine_info,
    summarise,
    write_result,
)

if TYPE_CHECKING:
    from warcore.engine import EngineConfig, Request

__all__ = [
    "SWEEP_FENCES",
    "Variant",
    "RunSample",
    "calibrate",
    "configure_overlap",
    "configure_sweep",
    "measure_overlap",
    "measure_sweep",
    "run_overlap",
    "run_sweep",
    "run_variant",
]


@dataclass(frozen=True)
class Variant:
    name: str
    fence: str
    loop: str
    backend: str | None = None
    """``None``: the benchmark's backend."""


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
OVERLAP_VARIANTS = (SERIAL, COARSE, FINE, UNSAFE, FINE_TORCH_NATIVE, FINE_AGAIN)
SWEEP_FENCES = (COARSE, FINE, UNSAFE)

DEFAULT_BACKEND = "trtllm_mha"
DEFAULT_LAYER_MS = 4.0
DEFAULT_SCHED_FRACTION = 0.4
DEFAULT_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)


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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def run_variant(
    base: EngineConfig,
    variant: Variant,
    trace: list[Request],
    device: str,
    oracle: dict[int, list[int]] | None = None,
) -> tuple[RunSample, dict[int, list[int]]]:
    """Run ``trace`` once with ``variant`` on a fresh engine; the sample and the outputs."""
    from warcore.engine import Engine
    from warcore.tools.trace_export import SCHEDULE_STREAM, Timeline, TraceRecorder

    cfg = replace(
        base,
        fence=variant.fence,  # type: ignore[arg-type]
        loop=variant.loop,  # type: ignore[arg-type]
        backend=variant.backend or base.backend,
    )
    recorder = TraceRecorder()
    # Engine construction finishes graph capture; closing drops its decision-cache entries.
    with Engine(cfg, device=device) as engine:
        report = engine.run(trace, observer=recorder)
    tl = Timeline(recorder)
    steps = sum(report.forwards.values())
    fw = [f for f in tl.forwards if f.items]
    gaps = tl.forward_gaps()
    writes = [s for s in tl.streams.get(SCHEDULE_STREAM, []) if s.label == "schedule_write"]
    sched_ms = tl.busy(SCHEDULE_STREAM) / len(writes) * 1e3 if writes else None
    if fw:
        spans = [(f.end - f.start) * 1e3 for f in fw]
        forward_ms: float | None = statistics.fmean(spans)
        step_ms = (fw[-1].end - fw[0].start) * 1e3 / max(1, steps)
        ideal: float | None = statistics.fmean(max(s, sched_ms or 0.0) for s in spans)
    else:
        forward_ms = ideal = None
        step_ms = report.elapsed_s * 1e3 / max(1, steps)
    sample = RunSample(
        tokens=report.tokens,
        elapsed_s=report.elapsed_s,
        tokens_per_s=report.tokens_per_s,
        steps=steps,
        forward_ms=forward_ms,
        idle_ms=statistics.fmean(gaps) * 1e3 if gaps else None,
        step_ms=step_ms,
        schedule_ms=sched_ms,
        ideal_ms=ideal,
        barriers=dict(report.barriers),
        published={
            f"{mode.name}:{point.value}": n
            for (mode, point), n in sorted(
                report.published.items(), key=lambda kv: (kv[0][0].name, kv[0][1].value)
            )
        },
        matches_oracle=None if oracle is None else report.outputs == oracle,
    )
    return sample, report.outputs


def calibrate(base: EngineConfig, trace: list[Request], device: str) -> tuple[float, str]:
    """The forward's time F in seconds (fine fence, no scheduler work), after a warm-up run,
    and how it was measured."""
    cfg = replace(base, schedule_work_s=0.0)
    run_variant(cfg, FINE, trace, device)  # warm-up: first-use costs of torch and the device
    sample, _ = run_variant(cfg, FINE, trace, device)
    if sample.forward_ms is not None:
        return sample.forward_ms / 1e3, "mean forward span on the forward stream"
    return sample.step_ms / 1e3, "wall time per step (the device reports no spans)"


def _base_config(args: argparse.Namespace) -> EngineConfig:
    import torch

    from warcore.engine import EngineConfig, ModelConfig

    layer_s = args.layer_ms / 1e3
    if args.device != "sim" and layer_s:
        layer_s = 0.0  # a real device's kernels take their own time; nothing to model
    return EngineConfig(
        model=ModelConfig(dtype=getattr(torch, args.dtype)),
        backend=args.backend,
        modelled_layer_s=layer_s,
    )


def _model_info(
    base: EngineConfig, args: argparse.Namespace, trace: list[Request]
) -> dict[str, Any]:
    return {
        "device": args.device,
        "backend": base.backend,
        "algorithm": base.algorithm,
        "dtype": args.dtype,
        "layers": base.model.layers,
        "modelled_layer_s": base.modelled_layer_s,
        "use_graphs": base.use_graphs,
        "requests": len(trace),
        "seed": args.seed,
        "max_new_tokens_total": sum(r.max_new_tokens for r in trace),
        "repeat": args.repeat,
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


def measure_overlap(args: argparse.Namespace) -> dict[str, Any]:
    from warcore.engine import synthetic_trace

    say = _progress(sys.stderr.isatty() and not args.quiet)
    trace = synthetic_trace(args.requests, seed=args.seed)
    base = _base_config(args)
    say("overlap: calibrating the forward time")
    forward_s, how = calibrate(base, trace, args.device)
    base = replace(base, schedule_work_s=args.sched_frac * forward_s)
    variants = OVERLAP_VARIANTS
    say("overlap: oracle and warm-up round")
    _, oracle = run_variant(base, SERIAL, trace, args.device)
    for v in variants:
        run_variant(base, v, trace, args.device)
    rounds: list[dict[str, RunSample]] = []
    for r in range(args.repeat):
        rnd: dict[str, RunSample] = {}
        for v in _rotated(variants, r):
            say(f"overlap: round {r + 1}/{args.repeat}: {v.name}")
            rnd[v.name], _ = run_variant(base, v, trace, args.device, oracle)
        rounds.append(rnd)
    say("")
    results = {}
    for v in variants:
        samples = [rnd[v.name] for rnd in rounds]
        results[v.name] = {
            "fence": v.fence,
            "loop": v.loop,
            "backend": v.backend or base.backend,
            "tokens_per_s": _stat(samples, "tokens_per_s"),
            "tokens_per_s_ratio_to_fine": _ratios(rounds, v.name, FINE.name, "tokens_per_s"),
            "idle_ms_per_gap": _stat(samples, "idle_ms"),
            "idle_ratio_to_fine": _ratios(rounds, v.name, FINE.name, "idle_ms"),
            "step_ms": _stat(samples, "step_ms"),
            "forward_ms": _stat(samples, "forward_ms"),
            "barriers": samples[-1].barriers,
            "published": samples[-1].published,
            "runs_differing_from_serial": sum(1 for s in samples if s.matches_oracle is False),
            "runs": [s.as_dict() for s in samples],
        }
    return {
        "model": _model_info(base, args, trace)
        | {
            "forward_s": forward_s,
            "forward_s_measured_as": how,
            "schedule_work_fraction": args.sched_frac,
            "schedule_work_s": base.schedule_work_s,
        },
        "variants": results,
        "checks": {
            "fine_over_unsafe_tokens_per_s": _ratios(
                rounds, FINE.name, UNSAFE.name, "tokens_per_s"
            ),
            "fine_over_coarse_tokens_per_s": _ratios(
                rounds, FINE.name, COARSE.name, "tokens_per_s"
            ),
            "fine_over_fine_again_tokens_per_s": _ratios(
                rounds, FINE.name, FINE_AGAIN.name, "tokens_per_s"
            ),
        },
        "machine": machine_info(args.device),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def overlap_table(result: dict[str, Any]) -> str:
    m = result["model"]
    head = (
        f"overlap: {m['device']}, backend {m['backend']}, {m['requests']} requests (seed "
        f"{m['seed']}), {m['layers']} layers x {m['modelled_layer_s'] * 1e3:g} ms modelled, "
        f"F = {m['forward_s'] * 1e3:.1f} ms, scheduler work {m['schedule_work_s'] * 1e3:.1f} ms "
        f"({m['schedule_work_fraction']:.0%} of F); median (min) of {m['repeat']} rounds"
    )
    rows = []
    for name, r in result["variants"].items():
        tps, ratio = r["tokens_per_s"], r["tokens_per_s_ratio_to_fine"]
        idle, iratio = r["idle_ms_per_gap"], r["idle_ratio_to_fine"]
        rows.append(
            [
                name,
                f"{tps['median']:.0f} ({tps['min']:.0f})",
                f"{ratio['median']:.3f} ({ratio['min']:.3f})",
                "-" if idle is None else f"{idle['median']:.2f} ({idle['min']:.2f})",
                "-" if iratio is None else f"{iratio['median']:.1f}",
                f"{r['step_ms']['median']:.1f}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["barriers"].items())) or "-",
                str(r["runs_differing_from_serial"]),
            ]
        )
    table = format_table(
        [
            "variant",
            "tokens/s",
            "x fine",
            "idle ms/gap",
            "x fine",
            "step ms",
            "barriers",
            "wrong runs",
        ],
        rows,
    )
    c = result["checks"]
    tail = "\n".join(
        f"{label} tokens/s, per round: median {r['median']:.3f}, min {r['min']:.3f}, "
        f"max {r['max']:.3f}"
        for label, r in (
            ("fine / unsafe", c["fine_over_unsafe_tokens_per_s"]),
            ("fine / coarse", c["fine_over_coarse_tokens_per_s"]),
            ("fine / fine A/A (noise)", c["fine_over_fine_again_tokens_per_s"]),
        )
        if r is not None
    )
    return "\n".join([head, table, tail])


def _add_common(parser: argparse.ArgumentParser, requests: int, repeat: int) -> None:
    parser.add_argument("--device", default="sim", help="sim (default) or cuda")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="attention backend")
    parser.add_argument("--requests", type=int, default=requests, help="requests in the trace")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    parser.add_argument("--repeat", type=int, default=repeat, help="measured rounds")
    parser.add_argument(
        "--layer-ms",
        type=float,
        default=DEFAULT_LAYER_MS,
        help="modelled device time per layer, ms (sim only)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "float64"), help="model dtype"
    )
    parser.add_argument("--json", metavar="FILE", help="result file (default: benchmarks/results/)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def configure_overlap(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, requests=24, repeat=11)
    parser.add_argument(
        "--sched-frac",
        type=float,
        default=DEFAULT_SCHED_FRACTION,
        help="scheduler device work per step, as a fraction of the forward's time",
    )


def _argv(args: argparse.Namespace) -> list[str] | None:
    argv: list[str] | None = getattr(args, "argv", None)
    return argv


def _check_sizes(args: argparse.Namespace) -> str | None:
    if args.requests < 1 or args.repeat < 1:
        return "--requests and --repeat must be positive"
    if args.layer_ms < 0:
        return "--layer-ms must be >= 0"
    return None


def run_overlap(args: argparse.Namespace) -> int:
    problem = _check_sizes(args) or ("--sched-frac must be >= 0" if args.sched_frac < 0 else None)
    if problem:
        print(f"warcore: error: {problem}", file=sys.stderr)
        return 2
    result = measure_overlap(args)
    print(overlap_table(result))
    print(f"wrote {write_result('overlap', result, args.json, _argv(args))}")
    return 0


# -- sweep -----------------------------------------------------------------------------------


def measure_sweep(args: argparse.Namespace) -> dict[str, Any]:
    from warcore.engine import synthetic_trace

    say = _progress(sys.stderr.isatty() and not args.quiet)
    trace = synthetic_trace(args.requests, seed=args.seed)
    base = _base_config(args)
    say("sweep: calibrating the forward time")
    forward_s, how = calibrate(base, trace, args.device)
    fractions: list[float] = args.fractions
    say("sweep: warm-up")
    for v in SWEEP_FENCES:
        run_variant(replace(base, schedule_work_s=forward_s * fractions[-1]), v, trace, args.device)
    # samples[point][round][variant]
    samples: list[list[dict[str, RunSample]]] = [[] for _ in fractions]
    for r in range(args.repeat):
        for i, frac in enumerate(fractions):
            cfg = replace(base, schedule_work_s=forward_s * frac)
            rnd: dict[str, RunSample] = {}
            for v in _rotated(SWEEP_FENCES, r + i):
                say(f"sweep: round {r + 1}/{args.repeat}, work {frac:.0%} of F: {v.name}")
                rnd[v.name], _ = run_variant(cfg, v, trace, args.device)
            samples[i].append(rnd)
    say("")
    points = []
    for i, frac in enumerate(fractions):
        rounds = samples[i]
        flat = [s for rnd in rounds for s in rnd.values()]
        ideal = _stat(flat, "ideal_ms")
        point: dict[str, Any] = {
            "fraction": frac,
            "schedule_work_ms": forward_s * frac * 1e3,
            "ideal_step_ms": ideal,
            "fences": {},
            "fine_over_coarse_tokens_per_s": _ratios(
                rounds, FINE.name, COARSE.name, "tokens_per_s"
            ),
            "fine_over_unsafe_tokens_per_s": _ratios(
                rounds, FINE.name, UNSAFE.name, "tokens_per_s"
            ),
            "fine_over_coarse_step_ms": _ratios(rounds, FINE.name, COARSE.name, "step_ms"),
        }
        for v in SWEEP_FENCES:
            runs = [rnd[v.name] for rnd in rounds]
            point["fences"][v.name] = {
                "fence": v.fence,
                "step_ms": _stat(runs, "step_ms"),
                "tokens_per_s": _stat(runs, "tokens_per_s"),
                "idle_ms_per_gap": _stat(runs, "idle_ms"),
                "runs": [s.as_dict() for s in runs],
            }
        points.append(point)
    ahead = [
        p["fine_over_coarse_tokens_per_s"]["median"] > 1.0
        for p in points
        if p["fraction"] >= 0.2 and p["fine_over_coarse_tokens_per_s"]
    ]
    return {
        "model": _model_info(base, args, trace)
        | {"forward_s": forward_s, "forward_s_measured_as": how},
        "points": points,
        "checks": {
            "fine_ahead_of_coarse_from_20_percent": all(ahead) if ahead else None,
            "fine_over_unsafe_tokens_per_s_min_median": min(
                (
                    p["fine_over_unsafe_tokens_per_s"]["median"]
                    for p in points
                    if p["fine_over_unsafe_tokens_per_s"]
                ),
                default=None,
            ),
        },
        "machine": machine_info(args.device),
    }


def sweep_table(result: dict[str, Any]) -> str:
    m = result["model"]
    head = (
        f"sweep: {m['device']}, backend {m['backend']}, {m['requests']} requests, "
        f"{m['layers']} layers x {m['modelled_layer_s'] * 1e3:g} ms modelled, F = "
        f"{m['forward_s'] * 1e3:.1f} ms; step ms per forward, median of {m['repeat']} rounds"
    )
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


def _fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("fractions must be >= 0, at least one")
    return sorted(values)


def configure_sweep(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, requests=24, repeat=4)
    parser.add_argument(
        "--fractions",
        type=_fractions,
        default=list(DEFAULT_FRACTIONS),
        help="scheduler work per step as fractions of the forward's time (comma list)",
    )
    parser.add_argument("--plot", metavar="FILE", help="also draw the sweep to FILE (PNG)")


def run_sweep(args: argparse.Namespace) -> int:
    problem = _check_sizes(args)
    if problem:
        print(f"warcore: error: {problem}", file=sys.stderr)
        return 2
    if args.plot:
        from warcore.tools import plot

        missing = plot.missing_matplotlib()
        if missing:  # say so before minutes of measuring, not after
            print(f"warcore: error: {missing}", file=sys.stderr)
            return 2
    result = measure_sweep(args)
    print(sweep_table(result))
    print(f"wrote {write_result('sweep', result, args.json, _argv(args))}")
    if args.plot:
        from warcore.tools import plot

        print(f"wrote {plot.plot_sweep(result, args.plot)}")
    return 0
