"""``warcore run``: the reference engine on a seeded synthetic trace, with its report."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from warcore.cli._common import (
    MILLISECONDS,
    REQUESTS,
    SEED,
    Command,
    Limit,
    UsageError,
    add_event_options,
    add_number,
    check_offered,
    check_writable,
    parse_flags,
    plugin_manager,
    writing,
)

if TYPE_CHECKING:
    from warcore.audit.trace_export import TraceRecorder
    from warcore.core import FlagValue
    from warcore.engine import EngineConfig, RunReport

__all__ = [
    "DTYPES",
    "FENCE_CHOICES",
    "LOOP_CHOICES",
    "NUM_DRAFT",
    "NUM_SLOTS",
    "RUN",
    "format_report",
]

FENCE_CHOICES = ("fine", "coarse", "none")
"""``--fence``: ``warcore.engine.FENCES``, and ``--loop`` ``warcore.engine.LOOPS`` (a test ties
them; the engine imports torch, and a typo is refused before torch is)."""
LOOP_CHOICES = ("overlap", "serial")
DTYPES = ("float64", "float32", "float16", "bfloat16")
"""``--dtype``: the ``torch`` dtypes of those names."""

NUM_DRAFT = Limit(
    int,
    1,
    31,
    " (a verify of 16 requests x (K+1) tokens must fit the engine's 512-token batch: "
    "EngineConfig.max_num_draft)",
)
"""``--num-draft``: ``EngineConfig().max_num_draft`` (a test ties the two)."""
NUM_SLOTS = Limit(int, 2, 65_536, " (slot 0 is the dummy; 65,536 slots: 512 MiB of K/V)")
DEFAULT_NUM_SLOTS = 4096
"""``--num-slots``: ``EngineConfig.num_slots`` (a test ties the two)."""


def _configure(parser: argparse.ArgumentParser) -> None:
    """What runs: device, backend, algorithm, fence, loop, the trace, the model."""
    parser.add_argument("--device", default=None, help="sim or cuda (default: cuda if present)")
    parser.add_argument("--backend", default="torch_native", help="attention backend name")
    parser.add_argument("--algorithm", default="none", help="speculative algorithm name")
    parser.add_argument(
        "--fence", default="fine", choices=FENCE_CHOICES, help="fine, coarse or none (unsafe)"
    )
    parser.add_argument("--loop", default="overlap", choices=LOOP_CHOICES, help="overlap or serial")
    add_number(parser, "--requests", REQUESTS, 64, "requests in the trace")
    add_number(parser, "--seed", SEED, 0, "trace seed")
    parser.add_argument(
        "--prompts",
        choices=("random", "repetitive", "shared"),
        default="random",
        help="trace prompts: random tokens, each a repeated short motif (what prompt "
        "lookup, --algorithm ngram, finds), or one of four shared prefixes then random tokens "
        "(what the host KV tier, --flag hicache, finds)",
    )
    add_number(
        parser,
        "--num-draft",
        NUM_DRAFT,
        4,
        "draft tokens per verify (speculative only; the most the default engine can run: "
        "16 requests x (K+1) tokens must fit its 512-token batch)",
    )
    parser.add_argument("--no-graphs", action="store_true", help="run decode eagerly")
    parser.add_argument(
        "--dtype",
        default="float64",
        choices=DTYPES,
        help="model dtype: float64 (default; keeps speculative decoding bit-exact), float32, "
        "float16, bfloat16 (flashinfer needs a 16-bit one)",
    )
    _configure_run(parser)


def _configure_run(parser: argparse.ArgumentParser) -> None:
    """The options after the engine's (in ``--help``'s order): checks, flags, modelled
    device time, then staging, the pool, the trace file and the progress bar."""
    _configure_checks_and_time(parser)
    _configure_staging_and_output(parser)


def _configure_checks_and_time(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the serial-loop comparison of tokens"
    )
    parser.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="engine flag, a declared one (README: Engine flags); repeatable",
    )
    add_number(
        parser,
        "--layer-ms",
        MILLISECONDS,
        0.0,
        "modelled device time per model layer in ms, using no CPU (sim only; what "
        "`warcore bench overlap` uses to make the CPU forward behave like a GPU's)",
    )
    add_number(
        parser,
        "--schedule-ms",
        MILLISECONDS,
        0.0,
        "scheduler device work per step in ms (a modelled H2D copy on the schedule stream)",
    )
    add_event_options(parser)


def _configure_staging_and_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-prefill-staging",
        action="store_true",
        help="never call the algorithm's prefill_shared_read_stager: a prefill whose step "
        "reads shared buffers later (eagle) keeps the coarse fence (stage, then publish off)",
    )
    add_number(
        parser,
        "--num-slots",
        NUM_SLOTS,
        DEFAULT_NUM_SLOTS,
        "KV pool slots (EngineConfig.num_slots); a small pool makes the prefix cache (--flag "
        "hicache) evict blocks from the device and load them back from host memory",
    )
    parser.add_argument(
        "--trace",
        metavar="FILE",
        help="write a Chrome/Perfetto trace of the run (host, forward and schedule streams, "
        "read-done records, barriers) to FILE (missing folders are created); open it at "
        "https://ui.perfetto.dev",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (auto: when stderr is a terminal)",
    )


class _ProgressBar:
    def __init__(self, stream: TextIO, label: str, enabled: bool) -> None:
        self.stream, self.label, self.enabled = stream, label, enabled
        self._last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        filled = 30 * done // total
        if filled == self._last and done != total:
            return
        self._last = filled
        bar = "#" * filled + "." * (30 - filled)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} tokens{end}")
        self.stream.flush()


def _run(args: argparse.Namespace) -> int:
    # Everything that can be refused is refused before torch is imported (seconds) and
    # before anything is built: the names, the flags, the output path.
    if args.trace:
        check_writable("--trace", args.trace, make_parents=True)
    flags = parse_flags(args.flag)
    pm = plugin_manager()
    check_offered(pm, "backend", args.backend)
    check_offered(pm, "algorithm", args.algorithm)
    from warcore.core import DuplicateNameError, UnknownNameError
    from warcore.device import DeviceError
    from warcore.engine import AlgorithmFactoryError

    try:
        return _serve(args, flags)
    except AlgorithmFactoryError as exc:  # the plugin failed, not the command line: exit 1
        print(f"warcore: error: {exc}", file=sys.stderr)
        return 1
    except (UnknownNameError, DuplicateNameError, ValueError, DeviceError) as exc:
        raise UsageError(str(exc)) from None


def _serve(args: argparse.Namespace, flags: dict[str, FlagValue]) -> int:
    import torch

    from warcore.engine import (
        Engine,
        EngineConfig,
        ModelConfig,
        compare_with_serial,
        synthetic_trace,
    )

    config = EngineConfig(
        model=ModelConfig(dtype=getattr(torch, args.dtype)),  # one of DTYPES (argparse)
        backend=args.backend,
        algorithm=args.algorithm,
        fence=args.fence,
        loop=args.loop,
        use_graphs=not args.no_graphs,
        num_draft=args.num_draft,
        flags=tuple(sorted(flags.items())),
        modelled_layer_s=args.layer_ms / 1e3,
        schedule_work_s=args.schedule_ms / 1e3,
        copy_wait=args.copy_wait,
        in_graph_event=args.in_graph_event,
        prefill_staging=not args.no_prefill_staging,
        num_slots=args.num_slots,
    )
    trace = synthetic_trace(args.requests, seed=args.seed, prompts=args.prompts)
    show = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
    recorder = None
    if args.trace:
        from warcore.audit.trace_export import TraceRecorder

        recorder = TraceRecorder()
    with Engine(config, device=args.device) as engine:
        report = engine.run(
            trace, progress=_ProgressBar(sys.stderr, "run", show), observer=recorder
        )
        if not args.no_verify:
            serial = Engine(_serial(config), device=args.device)
            with serial:
                expected = serial.run(trace, progress=_ProgressBar(sys.stderr, "serial", show))
            compare_with_serial(report, expected)
    print(format_report(report))  # first: a trace that fails to write loses no report
    if recorder is not None:
        sys.stdout.flush()
        print(_write_trace(args.trace, recorder, report))
    return 1 if report.matches_serial is False or report.errors or report.serial_errors else 0


def _write_trace(path: str, recorder: TraceRecorder, report: RunReport) -> str:
    from warcore.audit.trace_export import write_chrome_trace

    cfg = report.config
    meta = {
        "device": report.device,
        "backend": cfg.backend,
        "algorithm": cfg.algorithm,
        "fence": cfg.fence,
        "loop": cfg.loop,
        "requests": report.requests,
        "tokens": report.tokens,
    }
    with writing("--trace", path):
        events = write_chrome_trace(recorder, path, meta)
    return f"  trace           {events} events in {path} (open it at https://ui.perfetto.dev)"


def _serial(config: EngineConfig) -> EngineConfig:
    from dataclasses import replace

    return replace(config, loop="serial", fence="coarse")


def format_report(report: RunReport) -> str:
    cfg = report.config
    lines = [
        f"warcore run: device {report.device}, backend {cfg.backend}, algorithm "
        f"{cfg.algorithm}, fence {cfg.fence}, loop {cfg.loop}",
        f"  requests        {report.requests} ({report.rows_reused} admitted into a reused row)",
        f"  tokens          {report.tokens} in {report.elapsed_s:.2f} s = "
        f"{report.tokens_per_s:,.0f} tokens/s",
        f"  steps           {report.steps} ({_step_breakdown(report)})",
        "  read-done records (forward mode, record point, forwards):",
    ]
    for (mode, point), n in sorted(
        report.published.items(), key=lambda kv: (kv[0][0].name, kv[0][1].value)
    ):
        where = "none: coarse fence" if not point.publishes else point.value
        lines.append(f"    {mode.name:<16} {where:<20} {n}")
    barriers = ", ".join(f"{kind} {n}" for kind, n in sorted(report.barriers.items())) or "-"
    lines.append(f"  barriers        {barriers}")
    from warcore.audit.bindings import audit_bindings, binding_summary

    lines.append(f"  bindings        {binding_summary(report.bindings)}")
    lines += [f"    {f.describe()}" for f in audit_bindings(report.bindings)]
    staging = "fresh host tensors" if cfg.staging == "fresh" else "persistent ring"
    lines.append(f"  host staging    {staging}, {report.staging_stalls} stalls")
    pc = report.prefix_cache
    if pc is not None:
        lines.append(f"  prefix cache    {pc.format()}")
        order = f"{pc.copies_checked} copies checked, {len(pc.unordered)} unordered"
        lines.append(f"  host KV copies  {order}")
        lines += [f"    UNORDERED {problem}" for problem in pc.unordered[:_ERRORS_SHOWN]]
    if report.verifies:
        lines.append(
            f"  acceptance      {report.mean_accepted:.2f} draft tokens accepted per verify "
            f"({report.verifies} request-verifies, draft width {cfg.num_draft})"
        )
    if report.errors:
        lines.append(f"  errors          {len(report.errors)} requests failed")
        shown = sorted(report.errors.items())[:_ERRORS_SHOWN]
        lines += [f"    request {rid}: {error}" for rid, error in shown]
        if len(report.errors) > _ERRORS_SHOWN:
            lines.append(f"    ... and {len(report.errors) - _ERRORS_SHOWN} more")
    if report.staged_prefills:
        lines.append(f"  prefill staging {report.staged_prefills} prefills staged (early publish)")
    lines += [f"  prefill staging {problem}" for problem in report.stager_problems]
    lines += [f"  drafter         {problem}" for problem in report.drafter_problems]
    if report.matches_serial is not None:
        verdict = (
            "identical to the serial loop"
            if report.matches_serial
            else "DIFFERENT from the serial loop (a fence is unsound)"
        )
        lines.append(f"  tokens          {verdict}")
    elif report.errors or report.serial_errors:
        lines.append(
            f"  tokens          not compared with the serial loop: requests failed "
            f"({len(report.errors)} in this run, {report.serial_errors} in the serial loop)"
        )
    return "\n".join(lines)


_ERRORS_SHOWN = 3


def _step_breakdown(report: RunReport) -> str:
    """Steps by the step's target forward mode, then the idle ones: the parts add up."""
    parts = [f"{n} {m.name}" for m, n in sorted(report.forwards.items(), key=_by_name)]
    if report.idle_steps:
        parts.append(f"{report.idle_steps} idle")
    return ", ".join(parts) or "0 launched"


def _by_name(item: tuple[object, int]) -> str:
    return getattr(item[0], "name", "")


RUN = Command(
    "serve a seeded request trace with the reference overlap engine and report", _configure, _run
)
