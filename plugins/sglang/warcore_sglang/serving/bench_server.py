"""``python -m warcore_sglang.serving.bench_server``: what warcore costs inside a real sglang
server.

Starts the installed sglang's real ``Engine`` (its own child process, as in
:func:`warcore_sglang.serving.run_engine`) on this CPU with the tiny model, once per variant
per round, and measures in each start:

* ``startup_s``: the ``Engine`` constructor (scheduler and detokenizer children spawned,
  imported, the model loaded, the scheduler ready); ``scheduler_startup_s``: the scheduler
  child's life from its creation to the engine's ready;
* ``scheduler_activation_s`` (``warcore`` only): what activating took inside the scheduler
  child (importing warcore, loading its plugins, patching), from its start-up line: warcore's
  own start-up work, measured where it happens rather than as a difference of two noisy totals;
* ``ttft_ms``: the median latency of single 1-token requests (after one warm-up request): the
  time to first token through the engine;
* ``decode_tok_s``: the median of ``--decode-waves`` waves, each of ``--batch`` requests of
  ``--new-tokens`` tokens (4-token prompts: one small prefill, then decode steps), tokens
  generated per second.

And, after the rounds, ``--rank-check-starts`` starts of a ``tp_size=2`` Engine with
``WARCORE_SGLANG_CHECK_RANKS=1``: each rank's rank check, its time (resolving its cells, then
waiting for the other rank) and its share of that scheduler's start-up, as each rank says it.

And, in one more ``warcore`` start after the rounds, with ``WARCORE_SGLANG_METER`` on
(:mod:`warcore_sglang.activation._meter`): per batch of the scheduler's loop, warcore's own
time in its patched points against the batch's time (``run_batch`` to the end of the barrier),
by forward mode: the direct measurement the end-to-end ratios cannot resolve on these cores.

Variants: ``sglang`` (warcore-sglang installed but not activated), ``warcore``
(``WARCORE_SGLANG=1``: every sglang process activated, warcore's plugins resolving sglang's
declaration points, its event owner asked at every barrier), and ``sglang again`` (the first
variant once more: the A/A control, measuring the noise floor of the ratios). ``--plugins``
sets ``WARCORE_PLUGINS`` (default ``sglang``: warcore-sglang's own declarations). Each round runs
the three in a rotated order, after ``--warmup`` discarded runs (the first start after a while
reads a cold page cache: measured 16 ms TTFT against 8 ms right after); ratios are taken
within a round and summarised as median (min -
max). The trace is off. On a CPU the barrier's streams and events do nothing, so this measures
warcore's host-side cost on sglang's path, not the overlap a fine fence buys on a GPU.

Needs the environment of ``nox -s sglang_server`` (sglang and its serving pins, the stand-ins
on ``PYTHONPATH``, which :func:`warcore_sglang.serving.cpu_env` adds from a source checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warcore.cli import JsonOutput, Limit

from ..settings import ENV_METER_CONTROL
from . import harness as serving

__all__ = ["main", "measure"]

VARIANTS = {
    "sglang": {"WARCORE_SGLANG": ""},
    "warcore": {"WARCORE_SGLANG": "1"},
    "sglang again": {"WARCORE_SGLANG": ""},
}


def _waves(args: argparse.Namespace) -> list[list[serving.Request]]:
    warm = [[serving.Request("warm", [5, 6, 7, 8], 4)]]
    ttft = [
        [serving.Request(f"ttft-{k}", [9 + k, 10, 11, 12], 1)] for k in range(args.ttft_samples)
    ]
    decode = [
        [
            serving.Request(f"dec{w}-{k}", [20 + k, 21 + w, 22, 23], args.new_tokens)
            for k in range(args.batch)
        ]
        for w in range(args.decode_waves)
    ]
    return [*warm, *ttft, *decode]


_ACTIVE = re.compile(
    r"\((?:prefill |decode )?scheduler[^)]*\): warcore active on sglang \S+ in ([0-9.]+) s"
)
"""The scheduler's start-up line (``warcore_sglang._entry.startup_line``) when active: what
activating took in that process."""


def _one(variant: str, model: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**serving.cpu_env(), **VARIANTS[variant], "WARCORE_SGLANG_TRACE": ""}
    env["WARCORE_PLUGINS"] = args.plugins
    engine = serving.cpu_engine_args(model, log_level="warning")
    waves = _waves(args)
    result = serving.run_engine(
        engine, waves, env=env, timeout=args.timeout, workdir=work, name=variant.replace(" ", "_")
    )
    ttft = result["wave_s"][1 : 1 + args.ttft_samples]
    decode = result["wave_s"][1 + args.ttft_samples :]
    decode_s = statistics.median(decode)
    log = Path(result["log"]).read_text(errors="replace")
    activation = _ACTIVE.search(log)
    return {
        "variant": variant,
        "startup_s": round(result["startup_s"], 3),
        "scheduler_startup_s": round(result["scheduler_startup_s"], 3),
        "ttft_ms": round(statistics.median(ttft) * 1e3, 2),
        "ttft_samples_ms": [round(t * 1e3, 2) for t in ttft],
        "decode_tok_s": round(args.batch * args.new_tokens / decode_s, 1),
        "decode_s": round(decode_s, 3),
        "decode_samples_tok_s": [round(args.batch * args.new_tokens / d, 1) for d in decode],
        "warcore_active": activation is not None,
        "scheduler_activation_s": float(activation.group(1)) if activation else None,
    }


def _metered(model: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One more ``warcore`` start, every patched point timed inside the scheduler
    (``WARCORE_SGLANG_METER``): per batch, warcore's own time against the batch's."""
    work.mkdir(parents=True, exist_ok=True)
    meter = work / "meter.jsonl"
    env = {**serving.cpu_env(), **VARIANTS["warcore"], "WARCORE_SGLANG_TRACE": ""}
    env |= {"WARCORE_PLUGINS": args.plugins, "WARCORE_SGLANG_METER": str(meter), **_CONTROL}
    engine = serving.cpu_engine_args(model, log_level="warning")
    serving.run_engine(
        engine, _waves(args), env=env, timeout=args.timeout, workdir=work, name="metered"
    )
    return _per_batch(meter)


def _metered_pd(model: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``--pd``: a prefill and a decode server with warcore active and metered, the router in
    front (:mod:`warcore_sglang.serving.pd`); the same waves through the router, each wave's
    requests at once; per batch of each side's disaggregated loop."""
    from . import pd

    meters = {side: work / f"{side}-meter.jsonl" for side in ("prefill", "decode")}
    envs = {
        side: {**pd.pd_env(), **VARIANTS["warcore"], "WARCORE_SGLANG_TRACE": ""}
        | {"WARCORE_PLUGINS": args.plugins, "WARCORE_SGLANG_METER": str(meter), **_CONTROL}
        for side, meter in meters.items()
    }
    with pd.started(
        model, work, prefill_env=envs["prefill"], decode_env=envs["decode"], timeout=args.timeout
    ) as pair:
        for wave in _waves(args):
            pd.generate_each(pair.url, wave, len(wave), timeout=args.timeout)
    return {side: _per_batch(meter) for side, meter in meters.items()}


_CONTROL = {ENV_METER_CONTROL: "1"}
"""Every other metered batch a control: the meter around sglang's originals at the same sites."""


def _per_batch(meter: Path) -> dict[str, Any]:
    """The meter's lines summarised by forward mode (and over all): the real batches' figures,
    the control batches' beside them, and the real median minus the control's."""
    batches = [json.loads(line) for line in meter.read_text().splitlines() if line.strip()]
    out: dict[str, Any] = {}
    for mode in sorted({b["mode"] for b in batches}) + ["all"]:
        of = [b for b in batches if mode in ("all", b["mode"])]
        real = [b for b in of if not b.get("control")]
        control = [b for b in of if b.get("control")]
        out[mode] = _figures(real or of)
        if real and control:
            mine, theirs = out[mode], _figures(control)
            mine["control"] = {key: theirs[key] for key in _CONTROL_KEYS}
            mine["net_of_control_us"] = round(
                mine["warcore_us_median"] - theirs["warcore_us_median"], 2
            )
    return out


_CONTROL_KEYS = ("batches", "warcore_us_median", "calls_median", "by_point_us_median")


def _figures(of: list[dict[str, Any]]) -> dict[str, Any]:
    """One set of batches' medians and shares."""
    shares = sorted(b["warcore_ns"] / b["batch_ns"] for b in of)
    return {
        "batches": len(of),
        "warcore_us_median": round(statistics.median(b["warcore_ns"] for b in of) / 1e3, 2),
        "points_us_median": round(
            statistics.median(b.get("points_ns", b["warcore_ns"]) for b in of) / 1e3, 2
        ),
        "calls_median": statistics.median(b["calls"] for b in of),
        "by_point_us_median": _by_point(of),
        "floor_us_median": round(statistics.median(b.get("floor_ns", 0) for b in of) / 1e3, 2),
        "net_us_median": round(
            statistics.median(b["warcore_ns"] - b["calls"] * b.get("floor_ns", 0) for b in of)
            / 1e3,
            2,
        ),
        "batch_ms_median": round(statistics.median(b["batch_ns"] for b in of) / 1e6, 3),
        "share_median": round(statistics.median(shares), 5),
        "share_p90": round(shares[int(0.9 * (len(shares) - 1))], 5),
        "share_max": round(shares[-1], 5),
        "share_of_total": round(
            sum(b["warcore_ns"] for b in of) / sum(b["batch_ns"] for b in of), 5
        ),
    }


def _by_point(batches: list[dict[str, Any]]) -> dict[str, float]:
    """Each patched point's median µs per batch, over the batches that called it."""
    names = sorted({name for b in batches for name in b.get("by_point", {})})
    return {
        name: round(
            statistics.median(b["by_point"][name] for b in batches if name in b["by_point"]) / 1e3,
            2,
        )
        for name in names
    }


_RANK_CHECK = re.compile(
    r"TP(?P<tp>\d+)\] warcore-sglang: process \d+: the rank check took (?P<took>[0-9.]+) s "
    r"\(resolving (?P<resolve>[0-9.]+) s, waiting for the other ranks (?P<wait>[0-9.]+) s\), "
    r"(?P<share>[0-9.]+)% of this scheduler's start-up \((?P<lived>[0-9.]+) s\)"
)


def rank_check(model: Path, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--rank-check-starts`` starts of a ``tp_size=2`` Engine with the rank check on: per
    start and rank, the check's time (resolving, waiting) and its share of that scheduler's
    start-up, read from the line each rank says."""
    out = []
    for k in range(args.rank_check_starts):
        env = {**serving.cpu_env(), **VARIANTS["warcore"], "WARCORE_SGLANG_TRACE": ""}
        env |= {"WARCORE_PLUGINS": args.plugins, "WARCORE_SGLANG_CHECK_RANKS": "1"}
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
        engine = serving.cpu_engine_args(model, log_level="info", tp_size=2)
        wave = [[serving.Request("one", [5, 6, 7, 8], 2)]]
        result = serving.run_engine(
            engine, wave, env=env, timeout=args.timeout, workdir=work, name=f"ranks{k}"
        )
        for found in _RANK_CHECK.finditer(Path(result["log"]).read_text(errors="replace")):
            row = {key: float(value) for key, value in found.groupdict().items()}
            out.append({"start": k, **row, "tp": int(row["tp"]), "share": row["share"] / 100})
    return out


def _ratio(rows: list[dict[str, Any]], key: str, num: str, den: str) -> list[float]:
    by_round: dict[int, dict[str, Any]] = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["variant"]] = r
    return [round(v[num][key] / v[den][key], 4) for v in by_round.values() if num in v and den in v]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    loads = [os.getloadavg()[0]]
    args.meter_only = args.meter_only or args.pd
    rounds = 0 if args.meter_only else args.rounds
    with tempfile.TemporaryDirectory(prefix="warcore-bench-server-") as tmp:
        model = serving.write_tiny_model(Path(tmp) / "model")
        names = list(VARIANTS)
        for k in range(args.warmup):  # the first start after a while reads a cold page cache
            row = _one("sglang", model, Path(tmp) / f"warmup{k}", args)
            print(f"warm-up run (discarded): start-up {row['startup_s']:6.2f} s", flush=True)
        for rnd in range(rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for variant in order:
                row = _one(variant, model, Path(tmp) / f"r{rnd}", args)
                row["round"] = rnd
                rows.append(row)
                loads.append(os.getloadavg()[0])
                print(
                    f"round {rnd} {variant:<13} start-up {row['startup_s']:6.2f} s "
                    f"(scheduler {row['scheduler_startup_s']:6.2f} s)  TTFT "
                    f"{row['ttft_ms']:7.2f} ms  decode {row['decode_tok_s']:7.1f} tok/s",
                    flush=True,
                )
        if args.pd:
            pd_batches = _metered_pd(model, Path(tmp) / "pd", args)
            per_batch = {
                f"{side} {mode}": m for side, v in pd_batches.items() for mode, m in v.items()
            }
        else:
            per_batch = _metered(model, Path(tmp) / "metered", args)
        loads.append(os.getloadavg()[0])  # after the metered start too (its load is quoted)
        checks = [] if args.meter_only else rank_check(model, Path(tmp) / "ranks", args)
    return {
        "benchmark": "warcore inside sglang's real Engine on a CPU: start-up, TTFT, "
        "decode tokens/s; sglang alone vs warcore active, with an A/A control",
        "rounds": rounds,
        "warmup_runs_discarded": args.warmup,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "ttft_samples": args.ttft_samples,
        "decode_waves": args.decode_waves,
        "warcore_plugins": args.plugins,
        "runs": rows,
        "summary": _summarise(rows, per_batch, checks),
        "load_1min": {"before": loads[0], "during": loads[1:]},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
        "versions": _versions(),
        "git": _git(),
    }


def _summarise(
    rows: list[dict[str, Any]], per_batch: dict[str, Any], checks: list[dict[str, Any]]
) -> dict[str, Any]:
    """Each measure's spread over the rounds (ratios within a round), per batch, rank check."""
    summary: dict[str, Any] = {"per_batch": per_batch}
    if checks:
        summary["rank_check"] = {
            "checks": checks,
            "seconds": _spread([c["took"] for c in checks]),
            "resolving_s": _spread([c["resolve"] for c in checks]),
            "share_of_scheduler_startup": _spread([c["share"] for c in checks]),
        }
    for key in ("startup_s", "scheduler_startup_s", "ttft_ms", "decode_tok_s") if rows else ():
        summary[key] = {
            "warcore / sglang": _spread(_ratio(rows, key, "warcore", "sglang")),
            "A/A: sglang again / sglang": _spread(_ratio(rows, key, "sglang again", "sglang")),
            "medians": {
                v: statistics.median(r[key] for r in rows if r["variant"] == v) for v in VARIANTS
            },
        }
    active = [r for r in rows if r["variant"] == "warcore" and r["scheduler_activation_s"]]
    if active:
        summary["scheduler_activation"] = {
            "seconds": _spread([r["scheduler_activation_s"] for r in active]),
            "share_of_scheduler_startup": _spread(
                [round(r["scheduler_activation_s"] / r["scheduler_startup_s"], 4) for r in active]
            ),
        }
    return summary


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for dist in ("sglang", "torch", "warcore", "warcore-sglang"):
        try:
            out[dist] = version(dist)
        except Exception:
            out[dist] = "?"
    return out


def _git() -> str:
    try:
        root = Path(__file__).resolve().parents[4]  # plugins/sglang/warcore_sglang/serving/
        rev = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() or "?"
    except Exception:
        return "?"


COUNT = Limit(int, 1, 1_000)
"""Rounds, requests, waves and samples: at least one, and a run that ends."""
STARTS = Limit(int, 0, 100)
"""Warm-up runs and rank-check starts (0: none)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m warcore_sglang.serving.bench_server", description=__doc__
    )
    add = parser.add_argument
    add("--rounds", type=COUNT, default=5, help="rounds of the three variants")
    add("--batch", type=COUNT, default=16, help="requests in a decode wave")
    add("--new-tokens", type=COUNT, default=128, help="tokens per decode request")
    add("--decode-waves", type=COUNT, default=3, help="decode waves timed")
    add("--ttft-samples", type=COUNT, default=10, help="1-token requests timed")
    add("--warmup", type=STARTS, default=1, help="discarded runs before round 0")
    add("--timeout", type=Limit(float, 1.0, 86_400.0), default=300, help="seconds per run")
    add(
        "--plugins",
        default="sglang",
        help="WARCORE_PLUGINS for every server (default: sglang, warcore-sglang's own plugin)",
    )
    add(
        "--rank-check-starts",
        type=STARTS,
        default=2,
        help="starts of a tp_size=2 Engine with the rank check on, timing the check (0: none)",
    )
    add(
        "--meter-only",
        action="store_true",
        help="only the metered start (after --warmup discarded ones): no rounds, no rank check",
    )
    add(
        "--pd",
        action="store_true",
        help="the metered start as prefill/decode disaggregation (a prefill and a decode "
        "server, Mooncake over TCP, sglang-router in front; implies --meter-only): per batch "
        "of each side's loop (the environment of nox -s sglang_pd)",
    )
    add("--json", metavar="FILE", help="also write the result to FILE")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    output = JsonOutput(parser, args.json)
    missing = serving.missing_for_serving()
    if missing is not None:
        print(f"{parser.prog}: {missing}", file=sys.stderr)
        return 2
    started = time.monotonic()
    result = measure(args)
    result["command"] = "python -m warcore_sglang.serving.bench_server " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    result["wall_s"] = round(time.monotonic() - started, 1)
    _print_summary(result["summary"])
    return output.write(result)


def _print_summary(summary: dict[str, Any]) -> None:
    for key, s in summary.items():
        print(_SECTIONS.get(key, _ratio_lines)(key, s))


def _per_batch_lines(_: str, s: dict[str, Any]) -> str:
    return "\n".join(
        f"per batch, {mode:<7} {m['batches']:>4} batches: warcore "
        f"{m['warcore_us_median']:.1f} us ({m['calls_median']} patched calls, "
        f"{m['points_us_median']:.1f} us with the sglang code they call; net of the meter's "
        f"floor {m['floor_us_median']:.1f} us per call: {m['net_us_median']:.1f} us) of "
        f"{m['batch_ms_median']:.2f} ms: median {m['share_median']:.3%}, p90 "
        f"{m['share_p90']:.3%}, of the total {m['share_of_total']:.3%}"
        + _control_line(m)
        + "".join(
            f"\n    {p}: {us:.1f} us"
            + (
                f" (control {m['control']['by_point_us_median'].get(p, 0):.1f} us)"
                if "control" in m
                else ""
            )
            for p, us in m.get("by_point_us_median", {}).items()
        )
        for mode, m in s.items()
    )


def _control_line(m: dict[str, Any]) -> str:
    if "control" not in m:
        return ""
    c = m["control"]
    return (
        f"\n  same-site control ({c['batches']} batches: the meter around sglang's own): "
        f"{c['warcore_us_median']:.1f} us; warcore net of it: {m['net_of_control_us']:.1f} us"
    )


def _rank_check_line(_: str, s: dict[str, Any]) -> str:
    sec, res, share = s["seconds"], s["resolving_s"], s["share_of_scheduler_startup"]
    return (
        f"the rank check, tp_size=2, {len(s['checks'])} rank starts: "
        f"{sec['median']:.3f} s ({sec['min']:.3f}-{sec['max']:.3f}), resolving "
        f"{res['median']:.3f} s; {share['median']:.2%} "
        f"({share['min']:.2%}-{share['max']:.2%}) of each scheduler's start-up"
    )


def _activation_line(_: str, s: dict[str, Any]) -> str:
    sec, share = s["seconds"], s["share_of_scheduler_startup"]
    return (
        f"warcore's activation in the scheduler child: {sec['median']:.3f} s "
        f"({sec['min']:.3f}-{sec['max']:.3f}), {share['median']:.2%} of its start-up"
    )


def _ratio_lines(key: str, s: dict[str, Any]) -> str:
    w, aa = s["warcore / sglang"], s["A/A: sglang again / sglang"]
    return (
        f"{key:<20} warcore/sglang {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f})   "
        f"A/A {aa['median']:.3f} ({aa['min']:.3f}-{aa['max']:.3f})"
    )


_SECTIONS: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "per_batch": _per_batch_lines,
    "rank_check": _rank_check_line,
    "scheduler_activation": _activation_line,
}
"""Summary sections printed their own way; every other key is a tokens/s or TTFT ratio."""

if __name__ == "__main__":
    from warcore.cli import run_command

    raise SystemExit(run_command("python -m warcore_sglang.serving.bench_server", main))
