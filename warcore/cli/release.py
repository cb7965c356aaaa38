"""``warcore release ENGINE VERSION|WHEEL [--against AUDITED_VERSION]``: a new engine release
against the nearest audited one, and a draft data entry for it
(:mod:`warcore.integration.release_diff`).

Engines come only through the entry-point group ``warcore.integrations``
(:func:`warcore.integration.releases.load_engines`); torch-free, and nothing of the engine is
imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from warcore.cli._common import Command, UsageError
from warcore.integration.release_diff import (
    BadInput,
    choose_base,
    compare,
    parse_target,
    wheel_of,
)
from warcore.integration.releases import ENGINES, Engine, load_engines
from warcore.integration.wheel import SourceTree

__all__ = ["RELEASE"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "engine",
        metavar="ENGINE",
        help=f"an engine integration's name (those registered under {ENGINES})",
    )
    parser.add_argument(
        "target",
        metavar="VERSION|WHEEL",
        help="a version, fetched with pip download --no-deps into a temporary folder, or a "
        "wheel file",
    )
    parser.add_argument(
        "--against",
        metavar="AUDITED_VERSION",
        help="the audited release to compare with (default: the highest audited at or below "
        "the version, else the lowest above it)",
    )


def _engine(name: str) -> Engine:
    engines, failed = load_engines()
    if name in engines:
        return engines[name]
    if name in failed:
        raise UsageError(f"engine integration {name!r} failed to load: {failed[name]}")
    known = (
        ", ".join(sorted(engines))
        or f"none (no installed distribution registers one under {ENGINES})"
    )
    broken = f"; failed to load: {', '.join(sorted(failed))}" if failed else ""
    raise UsageError(f"unknown engine {name!r}; known: {known}{broken}")


def _run(args: argparse.Namespace) -> int:
    engine = _engine(args.engine)
    try:
        target = parse_target(engine, args.target)
        if not isinstance(target, Path):
            choose_base(engine, target, args.against)  # a bad --against before any download
        with wheel_of(engine, target) as wheel:
            base = choose_base(engine, wheel.version, args.against)
            comparison = compare(engine, wheel, SourceTree.of_wheel(wheel.path), base)
    except BadInput as exc:
        raise UsageError(str(exc)) from None
    print(comparison.report())
    return comparison.exit_status


RELEASE = Command(
    "a new engine release against the nearest audited one: per relied-on function unchanged, "
    "body or signature changed, moved or gone; the structural checks that fail; a draft data "
    "entry (exit 0 nothing changed, 1 review needed)",
    _configure,
    _run,
)
