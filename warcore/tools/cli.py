"""The ``warcore`` command line (also ``python -m warcore``).

Each subcommand is one :class:`Command` in :data:`_COMMANDS`: a help line, a function that adds
its arguments and a function that runs it and returns the exit status. To add a command, write
those two functions and add an entry; import anything heavy (torch, the engine) inside the run
function so that ``warcore plugins`` stays fast and works without a device.

Exit status: 0 ok, 1 problems found (``check``) or a plugin failed under strict mode, 2 bad
usage or a malformed ``WARCORE_*`` environment variable.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warcore.core import (
    LoaderConfig,
    PluginInfo,
    PluginLoadError,
    WarcorePluginManager,
    get_plugin_manager,
)
from warcore.core._specs import FlagValue
from warcore.tools import (
    bench_all,
    bench_lookup,
    bench_overlap,
    bench_sanitizer,
    bench_startup,
    run_cmd,
    soak,
)
from warcore.tools._inspect import MatrixRow, build_matrix, find_problems

__all__ = ["Command", "main"]

_PROG = "warcore"


@dataclass(frozen=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class _UsageError(Exception):
    """Bad input from the user (arguments or environment): one line on stderr, exit 2."""


# -- shared helpers ------------------------------------------------------------------------


def _plugin_manager() -> WarcorePluginManager:
    # Validate the environment here, so a malformed variable is a usage error naming it rather
    # than a traceback from deep inside plugin loading.
    try:
        LoaderConfig.from_env()
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    return get_plugin_manager()


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in col) for col in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        cells = [str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=False)] + [str(line[-1])]
        print("  ".join(cells).rstrip())


def _parse_flag(text: str) -> tuple[str, FlagValue]:
    name, sep, raw = text.partition("=")
    if not name:
        raise _UsageError(f"--flag {text!r}: expected NAME or NAME=VALUE")
    if not sep or raw.lower() in ("1", "true", "yes", "on"):
        return name, True
    if raw.lower() in ("0", "false", "no", "off"):
        return name, False
    try:
        return name, int(raw)
    except ValueError:
        return name, raw


# -- plugins -------------------------------------------------------------------------------


def _configure_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _hook_names(info: PluginInfo) -> str:
    return ",".join(h.removeprefix("warcore_") for h in info.hooks) or "-"


def _run_plugins(args: argparse.Namespace) -> int:
    pm = _plugin_manager()
    if args.json:
        _print_json(
            {
                "plugins": [info.as_dict() for info in pm.plugin_infos],
                "unknown_allowlist_names": list(pm.unknown_allowlist_names),
                "force_coarse": pm.config.force_coarse,
            }
        )
        return 0
    rows = [
        (i.name, i.distribution or "-", i.version or "-", i.status, _hook_names(i), i.error or "")
        for i in pm.plugin_infos
    ]
    _print_table(("NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS", "ERROR"), rows)
    return 0


# -- matrix --------------------------------------------------------------------------------


def _configure_matrix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="engine flag in the boundary context, e.g. nccl_allgather_in_overlap (repeatable)",
    )


def _matrix_cells(row: MatrixRow) -> tuple[str, ...]:
    runner = row.runner.value if row.runner is not None else "-"
    return (
        row.backend,
        row.mode.name,
        row.algorithm,
        row.declared.boundary.name,
        row.declared.source,
        runner,
        row.record_point.value,
        row.source,
    )


def _run_matrix(args: argparse.Namespace) -> int:
    flags = dict(_parse_flag(f) for f in args.flag)
    pm = _plugin_manager()
    rows = build_matrix(pm, flags)
    if args.json:
        _print_json({"flags": flags, "rows": [row.as_dict() for row in rows]})
        return 0
    headers = ("BACKEND", "MODE", "ALGORITHM", "BOUNDARY", "DECLARED BY", "RUNNER")
    _print_table((*headers, "RECORD POINT", "BECAUSE"), [_matrix_cells(r) for r in rows])
    return 0


# -- check ---------------------------------------------------------------------------------


def _configure_check(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def _run_check(args: argparse.Namespace) -> int:
    problems = find_problems(_plugin_manager())
    for problem in problems:
        print(problem)
    if not problems:
        print("ok")
    return 1 if problems else 0


# -- bench ---------------------------------------------------------------------------------

_BENCHES: dict[str, Command] = {
    "lookup": Command(
        "per-replay decision lookup vs a method call vs a pluggy hook call",
        bench_lookup.configure,
        bench_lookup.run,
    ),
    "overlap": Command(
        "reference engine: serial, coarse, fine and no fence on one trace (tokens/s, idle)",
        bench_overlap.configure_overlap,
        bench_overlap.run_overlap,
    ),
    "sweep": Command(
        "step time of coarse, fine and no fence as scheduler device work grows (--plot)",
        bench_overlap.configure_sweep,
        bench_overlap.run_sweep,
    ),
    "startup": Command(
        "plugin discovery and manager construction, 3 and 3+50 plugins, torch excluded",
        bench_startup.configure,
        bench_startup.run,
    ),
    "sanitizer": Command(
        "the WAR sanitizer's cost per forward against a plain run of the same trace",
        bench_sanitizer.configure,
        bench_sanitizer.run,
    ),
    "all": Command(
        "every benchmark with its defaults, each writing benchmarks/results/NAME.json",
        bench_all.configure,
        bench_all.run,
    ),
}


def _configure_bench(parser: argparse.ArgumentParser) -> None:
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


def _run_bench(args: argparse.Namespace) -> int:
    _plugin_manager()  # validates the environment before anything is measured
    if args.bench is None:
        if not args.plot_saved:
            raise _UsageError(f"bench: give a benchmark ({', '.join(_BENCHES)}) or --plot FILE")
        from warcore.tools import plot

        missing = plot.missing_matplotlib()
        if missing:
            raise _UsageError(missing)
        try:
            result = plot.load_sweep(args.sweep_json)
        except (OSError, ValueError) as exc:
            raise _UsageError(f"--plot: cannot read the sweep result: {exc}") from None
        print(f"wrote {plot.plot_sweep(result, args.plot_saved)}")
        return 0
    if args.plot_saved:  # `warcore bench --plot FILE sweep|all` means the same as after it
        if not hasattr(args, "plot"):
            raise _UsageError(f"--plot draws the sweep: use it with sweep or all, not {args.bench}")
        args.plot = args.plot or args.plot_saved
    return _BENCHES[args.bench].run(args)


# -- run ---------------------------------------------------------------------------------


def _run_run(args: argparse.Namespace) -> int:
    from warcore.core import DuplicateNameError, UnknownNameError
    from warcore.device import DeviceError

    flags = dict(_parse_flag(f) for f in args.flag)
    _plugin_manager()
    try:
        return run_cmd.run(args, flags)
    except (UnknownNameError, DuplicateNameError, ValueError, DeviceError) as exc:
        raise _UsageError(str(exc)) from None


# -- sanitize ------------------------------------------------------------------------------


def _configure_sanitize(parser: argparse.ArgumentParser) -> None:
    from warcore.tools import sanitize_cmd  # its heavy imports are inside its functions

    sanitize_cmd.configure(parser)


def _run_sanitize(args: argparse.Namespace) -> int:
    from warcore.core import DuplicateNameError, UnknownNameError
    from warcore.device import DeviceError
    from warcore.tools import sanitize_cmd

    flags = dict(_parse_flag(f) for f in args.flag)
    pm = _plugin_manager()
    try:
        return sanitize_cmd.run(args, flags, pm)
    except (UnknownNameError, DuplicateNameError, ValueError, DeviceError) as exc:
        raise _UsageError(str(exc)) from None


# -- soak ----------------------------------------------------------------------------------


def _run_soak(args: argparse.Namespace) -> int:
    _plugin_manager()
    try:
        return soak.run(args)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


# -- the table of commands -----------------------------------------------------------------

_COMMANDS: dict[str, Command] = {
    "plugins": Command(
        "list discovered plugins and their status", _configure_plugins, _run_plugins
    ),
    "matrix": Command(
        "backend x mode x algorithm -> boundary, record point, provenance",
        _configure_matrix,
        _run_matrix,
    ),
    "check": Command(
        "exit 1 with one line per problem (failed plugins, conflicts, unknown names)",
        _configure_check,
        _run_check,
    ),
    "bench": Command("benchmarks, each writing a JSON result", _configure_bench, _run_bench),
    "run": Command(
        "serve a seeded request trace with the reference overlap engine and report",
        run_cmd.configure,
        _run_run,
    ),
    "sanitize": Command(
        "poison the shared buffers at every read-done point and check no output changes",
        _configure_sanitize,
        _run_sanitize,
    ),
    "soak": Command(
        "a long random overlap run, every segment checked against serial tokens and sanitized",
        soak.configure,
        _run_soak,
    ),
}


def _add_commands(parser: argparse.ArgumentParser, commands: dict[str, Command], dest: str) -> None:
    sub = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    for name, command in commands.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Inspect and check warcore's read-done fence declarations."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log fallbacks (debug)")
    _add_commands(parser, _COMMANDS, dest="command")
    return parser


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format=f"{_PROG}: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # benchmarks record their command
    _setup_logging(args.verbose)
    try:
        return _COMMANDS[args.command].run(args)
    except _UsageError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except PluginLoadError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
