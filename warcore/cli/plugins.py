"""``warcore plugins``, ``warcore matrix`` and ``warcore check``: what is installed, what it
declares, and what is wrong with it (computed by :mod:`warcore.audit.matrix`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from warcore.audit.matrix import (
    MatrixRow,
    build_matrix,
    find_notes,
    find_problems,
    staging_lines,
)
from warcore.cli._common import (
    Command,
    UsageError,
    check_offered,
    parse_flags,
    plugin_manager,
    print_json,
    print_table,
)
from warcore.core import ForwardMode, PluginInfo, RecordPoint, StepFacts, WarcorePluginManager
from warcore.integration.releases import load_engines, release_in_force

__all__ = ["CHECK", "MATRIX", "PLUGINS"]


# -- plugins -------------------------------------------------------------------------------


def _configure_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@contextmanager
def _quiet() -> Iterator[None]:
    """No per-cell warnings while the matrix is built: what they would say is the output
    (``check``'s grouped lines, the matrix's provenance column)."""
    log = logging.getLogger("warcore")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _hook_names(info: PluginInfo) -> str:
    return ",".join(h.removeprefix("warcore_") for h in info.hooks) or "-"


def _notes(info: PluginInfo) -> str:
    errors = [info.error] if info.error else []
    return "; ".join(errors + [f"warning: {w}" for w in info.warnings])


PLUGINS_HEADERS = (
    "NAME",
    "DISTRIBUTION",
    "VERSION",
    "STATUS",
    "REGISTERED BY",
    "LOAD MS",
    "HOOKS",
    "ERROR OR WARNING",
)


def _run_plugins(args: argparse.Namespace) -> int:
    pm = plugin_manager()
    # Every hook the matrix asks, asked once: a plugin that another plugin's hook registers
    # at run time is listed too, as the matrix would see it.
    with _quiet():
        build_matrix(pm)
    if args.json:
        print_json(
            {
                "plugins": [info.as_dict() for info in pm.plugin_infos],
                "unknown_allowlist_names": list(pm.unknown_allowlist_names),
                "allowlist_problems": list(pm.allowlist_problems),
                "slow_plugin_seconds": pm.SLOW_PLUGIN_SECONDS,
                "force_coarse": pm.config.force_coarse,
            }
        )
        return 0
    rows = [
        (
            i.name,
            i.distribution or "-",
            i.version or "-",
            i.status,
            i.registered_by,
            "-" if i.load_ms is None else f"{i.load_ms:.1f}",
            _hook_names(i),
            _notes(i),
        )
        for i in pm.plugin_infos
    ]
    print_table(PLUGINS_HEADERS, rows)
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
    parser.add_argument(
        "--no-draft-model",
        action="store_true",
        help="resolve the step's event owner for a rank without a draft model",
    )
    parser.add_argument(
        "--draft-extend-staged",
        action="store_true",
        help="resolve the step's event owner for a step whose draft-extend is staged",
    )
    for option, what in _FILTERS:
        parser.add_argument(
            option,
            action="append",
            default=[],
            metavar="NAME[,NAME...]",
            help=f"only the cells of this {what}: repeatable, each a comma list (any of them "
            "matches; the filters combine by 'and'; --json too). A name that matches no cell "
            "is an error (exit 2)",
        )


_FILTERS = (
    ("--backend", "backend"),
    ("--mode", "forward mode (its name, DECODE, or value, decode)"),
    ("--algorithm", "algorithm"),
)


def _filters(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each filter option given -> its names, comma lists split, in order, each once; modes
    by name (``decode`` is ``DECODE``). An empty name or an unknown mode is a usage error."""
    given: dict[str, list[str]] = {}
    for option, _ in _FILTERS:
        for value in getattr(args, option.removeprefix("--")):
            parts = [part.strip() for part in value.split(",")]
            if not all(parts):
                raise UsageError(f"{option} {value!r}: an empty name in the list")
            for part in parts:
                name = _mode_name(part) if option == "--mode" else part
                if name not in given.setdefault(option, []):
                    given[option].append(name)
    return given


def _mode_name(text: str) -> str:
    try:
        return ForwardMode.parse(text).name
    except ValueError as exc:
        raise UsageError(f"--mode: {exc}") from None


def _check_matched(
    pm: WarcorePluginManager, rows: Sequence[MatrixRow], given: dict[str, list[str]]
) -> None:
    """Every filter name (``given``: option -> names) matched a cell, or a
    :class:`UsageError` naming the first that did not: a name nothing offers as the other
    commands say it (unknown, listing the valid ones; or disabled, and by which variable),
    otherwise the combination of filters that leaves it no cell."""
    present = {
        "--backend": {r.backend for r in rows},
        "--mode": {r.mode.name for r in rows},
        "--algorithm": {r.algorithm for r in rows},
    }
    for option, names in given.items():
        for name in names:
            if name in present[option]:
                continue
            if option != "--mode":
                try:
                    check_offered(pm, option.removeprefix("--"), name)
                except UsageError as exc:
                    raise UsageError(f"{option}: {exc}") from None
            others = "".join(
                f" with {other} {','.join(values)}"
                for other, values in given.items()
                if other != option
            )
            raise UsageError(
                f"{option} {name!r} matches no matrix cell{others} (a backend pairs only with "
                "the algorithms of its own engine, and none)"
            )


def _matrix_cells(row: MatrixRow) -> tuple[str, ...]:
    runner = row.runner.value if row.runner is not None else "-"
    point = row.record_point.value + (" (per batch)" if row.per_batch else "")
    if row.stage_point is not RecordPoint.NONE:
        point += f" ({row.stage_point.value} if staged)"
    owner = "-" if row.owner is None else f"{row.owner.owner or 'none'} ({row.owner.source})"
    host = "-"
    if row.runner is not None:
        release = row.host_release
        host = "done" if release is RecordPoint.NONE else release.value
        if row.host_reads is not None:
            host += f" (reads {row.host_reads.name})"
    return (
        row.backend,
        row.mode.name,
        row.algorithm,
        row.declared.boundary.name,
        row.declared.source,
        runner,
        point,
        row.source,
        row.eager_point.value if row.runner is not None else "-",
        owner,
        host,
        row.staging,
    )


def _run_matrix(args: argparse.Namespace) -> int:
    flags = parse_flags(args.flag)
    pm = plugin_manager()
    facts = StepFacts(
        has_draft_model=not args.no_draft_model, draft_extend_staged=args.draft_extend_staged
    )
    given = _filters(args)
    modes = [ForwardMode[name] for name in given["--mode"]] if "--mode" in given else None
    with _quiet():  # each cell's provenance is in the output
        rows = build_matrix(
            pm,
            flags,
            facts,
            backends=given.get("--backend"),
            modes=modes,
            algorithms=given.get("--algorithm"),
        )
    _check_matched(pm, rows, given)
    if args.json:
        print_json(
            {
                "flags": flags,
                "facts": {
                    "has_draft_model": facts.has_draft_model,
                    "draft_extend_staged": facts.draft_extend_staged,
                },
                "rows": [row.as_dict() for row in rows],
            }
        )
        return 0
    headers = ("BACKEND", "MODE", "ALGORITHM", "BOUNDARY", "DECLARED BY", "RUNNER")
    tail = ("RECORD POINT", "BECAUSE", "EAGER", "EVENT OWNER", "HOST SLOT", "PREFILL STAGING")
    print_table((*headers, *tail), [_matrix_cells(r) for r in rows])
    return 0


# -- check ---------------------------------------------------------------------------------


def _configure_check(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def _run_check(args: argparse.Namespace) -> int:
    pm = plugin_manager()  # loading warns as in every command (failed, slow, inert plugins)
    with _quiet():  # the lines below are the output: no per-cell warnings besides them
        problems = find_problems(pm)
        # Informational: a backend that models another engine's (BackendSpec.models) and
        # declares differently. Printed after the problems; never changes the exit status.
        notes = find_notes(pm)
        # Informational too: each algorithm's prefill staging hook's answer (sglang #38554),
        # and each engine integration's release in force.
        staging = staging_lines(pm)
        engines = [release_in_force(e) for e in load_engines()[0].values()]
    for line in (*problems, *notes, *staging, *sorted(engines)):
        print(line)
    if not problems:
        print("ok")
    return 1 if problems else 0


PLUGINS = Command("list discovered plugins and their status", _configure_plugins, _run_plugins)
MATRIX = Command(
    "backend x mode x algorithm -> boundary, record point, provenance",
    _configure_matrix,
    _run_matrix,
)
CHECK = Command(
    "exit 1 with one line per problem (failed plugins, conflicts, unknown names); 'note:' "
    "lines (a backend declaring differently from the one it models), 'staging:' lines "
    "(each algorithm's prefill staging hook) and 'engine:' lines (each engine integration's "
    "installed release, audited or not) never fail it",
    _configure_check,
    _run_check,
)
