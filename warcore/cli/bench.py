"""``warcore bench``: one subcommand per benchmark, ``all``, and ``--plot`` of a saved sweep.

Each subcommand parses its options, calls the measurement in :mod:`warcore.bench`, prints its
table and writes its JSON result.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warcore._files import write_text
from warcore.bench import (
    command_line,
    lookup,
    machine_info,
    overlap,
    result_path,
    sanitizer,
    startup,
    write_result,
)
from warcore.cli._common import (
    FRACTION,
    MILLISECONDS,
    REPEAT,
    REQUESTS,
    SEED,
    Command,
    Limit,
    Parser,
    UsageError,
    add_number,
    check_offered,
    check_writable,
    plugin_manager,
    writing,
)

__all__ = ["BENCH"]


def _argv(args: argparse.Namespace) -> list[str] | None:
    argv: list[str] | None = getattr(args, "argv", None)
    return argv


def _error(problem: str) -> int:
    print(f"warcore: error: {problem}", file=sys.stderr)
    return 2


def _write(args: argparse.Namespace, name: str, result: dict[str, Any]) -> Path:
    """The benchmark's JSON result, whole or not at all; a failed write is one line."""
    with writing("--json", result_path(name, args.json)):
        return write_result(name, result, args.json, _argv(args))


def _check_outputs(args: argparse.Namespace, name: str) -> None:
    """Before measuring: every file the benchmark will write can be written (a
    :class:`UsageError` naming the option otherwise)."""
    check_writable("--json", result_path(name, getattr(args, "json", None)), make_parents=True)
    if getattr(args, "plot", None):
        check_writable("--plot", args.plot, make_parents=True)


# -- lookup --------------------------------------------------------------------------------


CALLS = Limit(int, 1, 10_000_000)
"""``bench lookup --number``: 100 times the default (about a second per timing run)."""
PLUGINS = Limit(int, 1, 1_000)
"""``bench startup --plugins``: generated distributions, each a folder on disk."""


def _configure_lookup(parser: argparse.ArgumentParser) -> None:
    add_number(parser, "--number", CALLS, 100_000, "calls per timing run")
    add_number(parser, "--repeat", REPEAT, 5, "timing runs; the best is kept")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE as JSON")


def _run_lookup(args: argparse.Namespace) -> int:
    if args.json:
        check_writable("--json", args.json, make_parents=True)
    result = lookup.measure(number=args.number, repeat=args.repeat)
    print(lookup.table(result))
    if args.json:
        with writing("--json", args.json):
            write_text(args.json, json.dumps(result.as_dict(), indent=2) + "\n")
    return 0


# -- overlap and sweep ---------------------------------------------------------------------


def _add_common(parser: argparse.ArgumentParser, requests: int, repeat: int) -> None:
    parser.add_argument(
        "--device", default="sim", choices=("sim", "cuda"), help="sim (default) or cuda"
    )
    parser.add_argument("--backend", default=overlap.DEFAULT_BACKEND, help="attention backend")
    add_number(parser, "--requests", REQUESTS, requests, "requests in the trace")
    add_number(parser, "--seed", SEED, 0, "trace seed")
    add_number(parser, "--repeat", REPEAT, repeat, "measured rounds")
    add_number(
        parser,
        "--layer-ms",
        MILLISECONDS,
        overlap.DEFAULT_LAYER_MS,
        "modelled device time per layer, ms (sim only)",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "float64"), help="model dtype"
    )
    parser.add_argument("--json", metavar="FILE", help="result file (default: benchmarks/results/)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def _settings(args: argparse.Namespace) -> overlap.Settings:
    return overlap.Settings(
        device=args.device,
        backend=args.backend,
        requests=args.requests,
        seed=args.seed,
        repeat=args.repeat,
        layer_ms=args.layer_ms,
        dtype=args.dtype,
        quiet=args.quiet,
        sched_frac=getattr(args, "sched_frac", overlap.DEFAULT_SCHED_FRACTION),
        fractions=tuple(getattr(args, "fractions", overlap.DEFAULT_FRACTIONS)),
    )


def _configure_overlap(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, requests=24, repeat=11)
    add_number(
        parser,
        "--sched-frac",
        FRACTION,
        overlap.DEFAULT_SCHED_FRACTION,
        "scheduler device work per step, as a fraction of the forward's time",
    )


def _run_overlap(args: argparse.Namespace) -> int:
    check_offered(plugin_manager(), "backend", args.backend)
    _check_outputs(args, "overlap")
    result = overlap.measure_overlap(_settings(args))
    print(overlap.overlap_table(result))
    print(f"wrote {_write(args, 'overlap', result)}")
    return 0


def _fractions(text: str) -> list[float]:
    """``--fractions``: a comma list, each a :data:`FRACTION` (refused while parsing)."""
    values = [FRACTION(x) for x in text.split(",") if x.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    return sorted(values)


def _configure_sweep(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, requests=24, repeat=4)
    parser.add_argument(
        "--fractions",
        type=_fractions,
        default=list(overlap.DEFAULT_FRACTIONS),
        help="scheduler work per step as fractions of the forward's time (comma list; each "
        f"{FRACTION.range})",
    )
    parser.add_argument("--plot", metavar="FILE", help="also draw the sweep to FILE (PNG)")


def _run_sweep(args: argparse.Namespace) -> int:
    check_offered(plugin_manager(), "backend", args.backend)
    if args.plot:
        from warcore.bench import plot

        missing = plot.missing_matplotlib()
        if missing:  # say so before minutes of measuring, not after
            return _error(missing)
    _check_outputs(args, "sweep")
    result = overlap.measure_sweep(_settings(args))
    print(overlap.sweep_table(result))
    print(f"wrote {_write(args, 'sweep', result)}")
    if args.plot:
        from warcore.bench import plot

        with writing("--plot", args.plot):
            print(f"wrote {plot.plot_sweep(result, args.plot)}")
    return 0


# -- startup -------------------------------------------------------------------------------


def _configure_startup(parser: argparse.ArgumentParser) -> None:
    add_number(parser, "--repeat", REPEAT, 7, "measured rounds")
    add_number(parser, "--plugins", PLUGINS, 50, "generated plugins to add")
    parser.add_argument("--json", metavar="FILE", help="result file (default: benchmarks/results/)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def _run_startup(args: argparse.Namespace) -> int:
    quiet = args.quiet or not sys.stderr.isatty()
    _check_outputs(args, "startup")
    result = startup.measure(args.repeat, args.plugins, quiet=quiet)
    print(startup.table(result))
    print(f"wrote {_write(args, 'startup', result)}")
    return 0


# -- sanitizer -----------------------------------------------------------------------------


def _configure_sanitizer(parser: argparse.ArgumentParser) -> None:
    add_number(parser, "--requests", REQUESTS, 10, "requests in the trace")
    add_number(parser, "--repeat", REPEAT, 3, "measured rounds")
    add_number(parser, "--seed", SEED, 0, "trace seed")
    parser.add_argument("--json", metavar="FILE", help="result file (default: benchmarks/results/)")


def _run_sanitizer(args: argparse.Namespace) -> int:
    _check_outputs(args, "sanitizer")
    result = sanitizer.measure(requests=args.requests, repeat=args.repeat, seed=args.seed)
    print(sanitizer.table(result))
    print(f"wrote {_write(args, 'sanitizer', result)}")
    return 0


# -- all -----------------------------------------------------------------------------------
# The command behind BENCHMARKS.md. It takes several minutes on the 2-vCPU development machine
# (the sweep dominates); each benchmark can be run on its own with other sizes.

Configure = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _benches() -> list[tuple[str, Configure, Run, list[str]]]:
    benches: list[tuple[str, Configure, Run, list[str]]] = [
        # lookup writes JSON only when asked; give it the same default place.
        ("lookup", _configure_lookup, _run_lookup, ["--json", str(result_path("lookup", None))]),
        ("overlap", _configure_overlap, _run_overlap, []),
        ("sweep", _configure_sweep, _run_sweep, []),
        ("startup", _configure_startup, _run_startup, []),
        ("sanitizer", _configure_sanitizer, _run_sanitizer, []),
    ]
    return benches


def _complete_lookup(path: Path, argv: list[str] | None) -> None:
    """Give the lookup result what the others carry (lookup writes only its numbers)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data = {"benchmark": "lookup", "command": command_line(argv), **data}
    data["machine"] = machine_info()
    with writing("lookup result", path):
        write_text(path, json.dumps(data, indent=2) + "\n")


def _configure_all(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", metavar="FILE", help="also draw the sweep to FILE (PNG)")


def _run_all(args: argparse.Namespace) -> int:
    if args.plot:
        from warcore.bench import plot

        missing = plot.missing_matplotlib()
        if missing:  # before minutes of measuring, not after
            return _error(missing)
        check_writable("--plot", args.plot, make_parents=True)
    for name in ("lookup", "overlap", "sweep", "startup", "sanitizer"):
        check_writable(f"{name} result", result_path(name, None), make_parents=True)
    status = 0
    for name, configure_one, run_one, argv in _benches():
        parser = Parser(prog=f"warcore bench {name}")
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


# -- the bench command ---------------------------------------------------------------------

_BENCHES: dict[str, Command] = {
    "lookup": Command(
        "per-replay decision lookup vs a method call vs a pluggy hook call",
        _configure_lookup,
        _run_lookup,
    ),
    "overlap": Command(
        "reference engine: serial, coarse, fine and no fence on one trace (tokens/s, idle)",
        _configure_overlap,
        _run_overlap,
    ),
    "sweep": Command(
        "step time of coarse, fine and no fence as scheduler device work grows (--plot)",
        _configure_sweep,
        _run_sweep,
    ),
    "startup": Command(
        "plugin discovery and manager construction, 3 and 3+50 plugins, torch excluded",
        _configure_startup,
        _run_startup,
    ),
    "sanitizer": Command(
        "the WAR sanitizer's cost per forward against a plain run of the same trace",
        _configure_sanitizer,
        _run_sanitizer,
    ),
    "all": Command(
        "every benchmark with its defaults, each writing benchmarks/results/NAME.json",
        _configure_all,
        _run_all,
    ),
}


def _configure(parser: argparse.ArgumentParser) -> None:
    # Optional subcommand: `warcore bench --plot FILE` alone redraws the saved sweep.
    parser.add_argument(
        "--plot",
        dest="plot_saved",
        metavar="FILE",
        help="without a benchmark: draw the saved sweep result (--sweep-json) to FILE (PNG)",
    )
    parser.add_argument(
        "--sweep-json",
        default="benchmarks/results/sweep.json",
        metavar="FILE",
        help="the sweep result --plot draws (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for name, command in _BENCHES.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))


def _run(args: argparse.Namespace) -> int:
    plugin_manager()  # validates the environment before anything is measured
    if args.bench is None:
        if not args.plot_saved:
            raise UsageError(f"bench: give a benchmark ({', '.join(_BENCHES)}) or --plot FILE")
        from warcore.bench import plot

        missing = plot.missing_matplotlib()
        if missing:
            raise UsageError(missing)
        check_writable("--plot", args.plot_saved, make_parents=True)
        try:
            result = plot.load_sweep(args.sweep_json)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--plot: cannot read the sweep result: {exc}") from None
        with writing("--plot", args.plot_saved):
            print(f"wrote {plot.plot_sweep(result, args.plot_saved)}")
        return 0
    if args.plot_saved:  # `warcore bench --plot FILE sweep|all` means the same as after it
        if not hasattr(args, "plot"):
            raise UsageError(f"--plot draws the sweep: use it with sweep or all, not {args.bench}")
        args.plot = args.plot or args.plot_saved
    return _BENCHES[args.bench].run(args)


BENCH = Command("benchmarks, each writing a JSON result", _configure, _run)
