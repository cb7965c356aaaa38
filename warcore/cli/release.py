"""``warcore release ENGINE VERSION|WHEEL [--against AUDITED_VERSION] [--write-surface]``: a new
engine release against the nearest audited one, and a draft data entry for it
(:mod:`warcore.integration.release_diff`); with ``--write-surface``, the release's WAR surface
written to the integration's surfaces folder (:mod:`warcore.integration.surface`).

Engines come only through the entry-point group ``warcore.integrations``
(:func:`warcore.integration.releases.load_engines`); torch-free, and nothing of the engine is
imported.
"""

from __future__ import annotations

import argparse
import os
import tempfile
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
from warcore.integration.surface import compute, dump
from warcore.integration.wheel import BadWheel, SourceTree, Wheel

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
    parser.add_argument(
        "--write-surface",
        action="store_true",
        help="write the release's WAR surface to the integration's surfaces folder "
        "(<version>.json, to review and commit) instead of comparing",
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
            if args.write_surface:
                print(_write_surface(engine, wheel))
                return 0
            base = choose_base(engine, wheel.version, args.against)
            comparison = compare(engine, wheel, SourceTree.of_wheel(wheel.path), base)
    except (BadInput, BadWheel) as exc:  # BadWheel: a wheel that does not read back whole
        raise UsageError(str(exc)) from None
    print(comparison.report())
    return comparison.exit_status


def _write_surface(engine: Engine, wheel: Wheel) -> str:
    """The wheel's surface written (whole or not at all) where the engine keeps it."""
    path = engine.surface_file(str(wheel.version))
    if not engine.surface or path is None:
        raise BadInput(f"{engine.name}: the integration declares no WAR surface")
    surface = compute(engine.surface, SourceTree.of_wheel(wheel.path))
    text = dump(
        surface,
        engine=engine.name,
        version=str(wheel.version),
        wheel=wheel.name,
        sha256=wheel.sha256,
    )
    written = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as file:
            written = file.name
            file.write(text)
        os.replace(written, path)
    except OSError as exc:
        if written is not None:
            Path(written).unlink(missing_ok=True)  # never a half-written file beside the data
        raise BadInput(f"{engine.name}: cannot write {path}: {exc.strerror or exc}") from None
    entries = sum(len(rows) for rows in surface.values())
    return f"wrote {path}: {len(surface)} sections, {entries} entries (review, then commit it)"


RELEASE = Command(
    "a new engine release against the nearest audited one: per relied-on function unchanged, "
    "body or signature changed, moved or gone; the structural checks that fail; a draft data "
    "entry (exit 0 nothing changed, 1 review needed)",
    _configure,
    _run,
)
