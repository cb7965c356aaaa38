"""``warcore plugins``, ``warcore matrix`` and ``warcore check``: what is installed, what it
declares, and what is wrong with it (computed by :mod:`warcore.audit.matrix`)."""

from __future__ import annotations

import argparse

from warcore.audit.matrix import MatrixRow, build_matrix, find_problems
from warcore.cli._common import Command, parse_flag, plugin_manager, print_json, print_table
from warcore.core import PluginInfo

__all__ = ["CHECK", "MATRIX", "PLUGINS"]


# -- plugins -------------------------------------------------------------------------------


def _configure_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _hook_names(info: PluginInfo) -> str:
    return ",".join(h.removeprefix("warcore_") for h in info.hooks) or "-"


def _run_plugins(args: argparse.Namespace) -> int:
    pm = plugin_manager()
    if args.json:
        print_json(
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
    print_table(("NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS", "ERROR"), rows)
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
    flags = dict(parse_flag(f) for f in args.flag)
    pm = plugin_manager()
    rows = build_matrix(pm, flags)
    if args.json:
        print_json({"flags": flags, "rows": [row.as_dict() for row in rows]})
        return 0
    headers = ("BACKEND", "MODE", "ALGORITHM", "BOUNDARY", "DECLARED BY", "RUNNER")
    print_table((*headers, "RECORD POINT", "BECAUSE"), [_matrix_cells(r) for r in rows])
    return 0


# -- check ---------------------------------------------------------------------------------


def _configure_check(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def _run_check(args: argparse.Namespace) -> int:
    problems = find_problems(plugin_manager())
    for problem in problems:
        print(problem)
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
    "exit 1 with one line per problem (failed plugins, conflicts, unknown names)",
    _configure_check,
    _run_check,
)
