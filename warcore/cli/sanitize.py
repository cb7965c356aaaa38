"""``warcore sanitize``: run the WAR sanitizer over the declared matrix and report.

One row per backend x algorithm: every mode's declared boundary and record point, how many
forwards ran with poisoned buffers, and the verdict. ``--explain`` adds the read tracer's
account of where each mode's last shared read is. Its cost per forward is measured by
``warcore bench sanitizer``.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

from warcore.cli._common import (
    REQUESTS,
    SEED,
    Command,
    UsageError,
    add_event_options,
    add_number,
    check_offered,
    parse_flags,
    plugin_manager,
    print_table,
)

if TYPE_CHECKING:
    from warcore.audit.sanitizer import Combination, ModeSummary, SanitizeReport
    from warcore.audit.tracer import ReadTrace
    from warcore.core import FlagValue, WarcorePluginManager

__all__ = ["SANITIZE"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", action="append", default=[], metavar="NAME", help="backend (repeatable)"
    )
    parser.add_argument(
        "--algorithm",
        action="append",
        default=[],
        metavar="NAME",
        help="speculative algorithm (repeatable)",
    )
    parser.add_argument(
        "--all", action="store_true", help="every registered backend x algorithm the engine runs"
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also trace an eager run and say where each mode's last shared read is",
    )
    add_number(parser, "--requests", REQUESTS, 10, "requests in the trace")
    add_number(parser, "--seed", SEED, 0, "trace seed")
    parser.add_argument("--device", default="sim", help="sim (default) or cuda")
    parser.add_argument(
        "--flag", action="append", default=[], metavar="NAME[=VALUE]", help="engine flag"
    )
    parser.add_argument(
        "--host-buffers",
        action="store_true",
        help="also poison each forward's staged host buffers at their release point (sim)",
    )
    parser.add_argument("--no-graphs", action="store_true", help="run decode-like modes eagerly")
    parser.add_argument(
        "--no-plant-node", action="store_true", help="capture graphs without the in-graph node"
    )
    add_event_options(parser)
    parser.add_argument(
        "--no-bindings",
        action="store_true",
        help="skip the binding audit (the overlap run checking which record each wait bound to)",
    )
    parser.add_argument(
        "--sglang-fallback",
        action="store_true",
        help="use sglang #34052's record point for graphs without a node (IN_REPLAY before "
        "the replay), to see why warcore records after the replay instead",
    )


def _run(args: argparse.Namespace) -> int:
    flags = parse_flags(args.flag)
    pm = plugin_manager()
    for kind, names in (("backend", args.backend), ("algorithm", args.algorithm)):
        for name in names:
            check_offered(pm, kind, name)  # before torch is imported
    from warcore.core import DuplicateNameError, UnknownNameError
    from warcore.device import DeviceError

    try:
        return _sanitize_all(args, flags, pm)
    except (UnknownNameError, DuplicateNameError, ValueError, DeviceError) as exc:
        raise UsageError(str(exc)) from None


def _sanitize_all(
    args: argparse.Namespace, flags: dict[str, FlagValue], pm: WarcorePluginManager
) -> int:
    """Exit status: 0 every combination sound; 1 a violation or an engine error, or a name
    that could not be audited: a backend or algorithm named with ``--backend``/``--algorithm``
    (with ``--all``: any registered one, or one disabled because two plugins offer it) that had
    no combination sanitized. The last line says how many were skipped and why."""
    from warcore.audit.sanitizer import combinations
    from warcore.audit.tracer import violation_note

    if not (args.all or args.backend or args.algorithm):
        raise ValueError("say what to sanitize: --backend NAME, --algorithm NAME, or --all")
    combos = combinations(pm, args.backend, args.algorithm, args.device)
    reports = [_sanitize(args, flags, pm, combo) for combo in combos]
    _print_reports(reports)
    problems = [r for r in reports if not r.sound]
    for report in [r for r in reports if not r.sound or r.binding_warnings]:
        print()
        print(report.format())
    host_problems = _host_buffers(args, flags, pm, combos) if args.host_buffers else []
    if args.explain:
        found = {(r.backend, r.algorithm): r.violation for r in reports}
        for combo in combos:
            if combo.skipped is None:
                print()
                trace = _trace(args, flags, pm, combo)
                print(_explain(trace))
                violation = found.get((combo.backend, combo.algorithm))
                if violation is not None:
                    print(violation_note(trace, violation))
                report = next(
                    r
                    for r in reports
                    if (r.backend, r.algorithm) == (combo.backend, combo.algorithm)
                )
                print(_explain_bindings(report))
    ran = sum(r.skipped is None for r in reports)
    unaudited = _unaudited(args, pm, reports)
    violated = bool(problems or host_problems)
    verdict = "VIOLATIONS FOUND" if violated else "NOT AUDITED" if unaudited else "all sound"
    line = f"{verdict}: {_n(ran, 'combination')} sanitized, {len(reports) - ran} skipped"
    why = Counter(r.skipped for r in reports if r.skipped is not None)
    if why:
        line += " (" + "; ".join(f"{n} {reason}" for reason, n in sorted(why.items())) + ")"
    if unaudited:
        line += "; " + "; ".join(unaudited)
    print(f"\n{line}")
    return 1 if violated or unaudited else 0


def _unaudited(
    args: argparse.Namespace, pm: WarcorePluginManager, reports: list[SanitizeReport]
) -> list[str]:
    """Why each backend or algorithm that had to be audited had no combination sanitized:
    the ones named; with ``--all``, every registered one and every one disabled as a
    duplicate (a registry problem would otherwise shrink ``--all`` to fewer names)."""
    from warcore.audit.sanitizer import ELSEWHERE
    from warcore.core import get_registry

    registry = get_registry(pm)
    out: list[str] = []
    for label, named, table in (
        ("backend", args.backend, registry.backends),
        ("algorithm", args.algorithm, registry.algorithms),
    ):
        disabled = _disabled(registry, label)
        required = list(named) or ([*table, *disabled] if args.all else [])
        for name in sorted(set(required)):
            mine = [r for r in reports if getattr(r, label) == name]
            if any(r.skipped is None for r in mine):
                continue
            elsewhere = all((r.skipped or "").startswith(ELSEWHERE) for r in mine)
            if mine and elsewhere and not named:
                continue  # --all: runs only in another engine or on another device (stated)
            reasons = sorted({r.skipped for r in mine if r.skipped is not None})
            reason = disabled.get(name) or "; ".join(reasons) or "no combination to run"
            out.append(f"{label} {name!r} had no combination sanitized ({reason})")
    return out


def _disabled(registry: object, label: str) -> dict[str, str]:
    """Names of ``label`` the registry disabled (offered by more than one plugin), with why."""
    duplicates: dict[str, str] = getattr(registry, "_duplicates", {})
    prefix = f"{label}:"
    return {k[len(prefix) :]: v for k, v in duplicates.items() if k.startswith(prefix)}


def _sanitize(
    args: argparse.Namespace,
    flags: dict[str, FlagValue],
    pm: WarcorePluginManager,
    combo: Combination,
) -> SanitizeReport:
    from warcore.audit.sanitizer import SanitizeReport, sanitize

    if combo.skipped is not None:
        report = SanitizeReport(combo.backend, combo.algorithm, args.device, args.requests)
        report.skipped = combo.skipped
        return report
    return sanitize(
        combo.backend,
        combo.algorithm,
        pm=pm,
        device=args.device,
        requests=args.requests,
        seed=args.seed,
        flags=flags,
        use_graphs=not args.no_graphs,
        plant_node=not args.no_plant_node,
        sglang_fallback=args.sglang_fallback,
        bindings=not args.no_bindings,
        copy_wait=args.copy_wait,
        in_graph_event=args.in_graph_event,
    )


def _host_buffers(
    args: argparse.Namespace,
    flags: dict[str, FlagValue],
    pm: WarcorePluginManager,
    combos: list[Combination],
) -> list[object]:
    """``--host-buffers``: the host-buffer sanitizer over every combination that ran; its
    violations."""
    from warcore.audit.host_buffers import sanitize_host_buffers
    from warcore.audit.sanitizer import engine_config, trace_for

    if args.device != "sim":
        raise ValueError("--host-buffers runs on the sim device only (--device sim)")
    found: list[object] = []
    print()
    for combo in combos:
        if combo.skipped is not None:
            continue
        config = engine_config(
            combo.backend,
            combo.algorithm,
            flags=flags,
            use_graphs=not args.no_graphs,
            plant_node=not args.no_plant_node,
        )
        report = sanitize_host_buffers(config, trace_for(args.requests, args.seed), pm=pm)
        print(f"{combo.backend} / {combo.algorithm}: {report.format()}")
        if not report.sound:
            found.append(report)
    return found


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _mode_cell(m: ModeSummary) -> str:
    runner = "" if m.runner == "target" else f"{m.runner} "
    points = "/".join(sorted(p.value for p in m.record_points))
    return f"{runner}{m.mode.name} {m.declared.name}->{points}"


def _print_reports(reports: list[SanitizeReport]) -> None:
    headers = ("BACKEND", "ALGORITHM", "MODE DECLARED->RECORD POINT", "CHECKED", "VERDICT")
    rows = [
        (
            r.backend,
            r.algorithm,
            ", ".join(_mode_cell(m) for m in r.modes) or "-",
            "-" if r.skipped else f"{r.checked}/{r.forwards}",
            r.verdict + (f" ({r.skipped})" if r.skipped else ""),
        )
        for r in reports
    ]
    print_table(headers, rows)


# -- --explain -----------------------------------------------------------------------------


def _trace(
    args: argparse.Namespace,
    flags: dict[str, FlagValue],
    pm: WarcorePluginManager,
    combo: Combination,
) -> ReadTrace:
    from warcore.audit.tracer import DEFAULT_TRACE_REQUESTS, trace_reads

    return trace_reads(
        combo.backend,
        combo.algorithm,
        pm=pm,
        device=args.device,
        requests=min(args.requests, DEFAULT_TRACE_REQUESTS),
        seed=args.seed,
        flags=flags,
    )


def _explain(trace: ReadTrace) -> str:
    lines = [f"{trace.backend} / {trace.algorithm}: shared reads of an eager run (read tracer)"]
    for m in trace.modes():
        points = "/".join(sorted(p.value for p in m.record_points))
        after = f"{m.reads_after_point} after the record point" if m.reads_after_point else ""
        lines.append(
            f"  {m.runner:<6} {m.mode.name:<16} {m.summary()}; {m.reads_allow()}, declared "
            f"{m.declared.name} ({m.declared_by}), records at {points}"
            f"{'; ' + after if after else ''}; {m.host_summary()}"
        )
    return "\n".join(lines)


_BINDINGS_SHOWN = 8


def _explain_bindings(report: SanitizeReport) -> str:
    """Per step of the binding run, the forward each wait meant and the record it got."""
    from warcore.audit.bindings import describe_binding

    log = report.binding_log
    lines = [f"{report.backend} / {report.algorithm}: waits of the overlap run (binding audit)"]
    lines += [f"  {describe_binding(b)}" for b in log[:_BINDINGS_SHOWN]]
    if len(log) > _BINDINGS_SHOWN:
        lines.append(f"  ... {len(log) - _BINDINGS_SHOWN} more ({report.bindings})")
    elif not log:
        lines.append("  no wait on a read-done event (every barrier was coarse)")
    return "\n".join(lines)


SANITIZE = Command(
    "poison the shared buffers at every read-done point and check no output changes",
    _configure,
    _run,
)
