"""``warcore soak``: a long random overlap run, every segment checked against serial tokens
and sanitized (:func:`warcore.audit.soak.soak`)."""

from __future__ import annotations

import argparse

from warcore.audit.soak import soak
from warcore.cli._common import (
    REQUESTS,
    SEED,
    Command,
    Limit,
    UsageError,
    add_number,
    plugin_manager,
)

__all__ = ["SOAK", "STEPS"]


STEPS = Limit(int, 1, 1_000_000)
"""``--steps``: 50 times the default; at the README's 20,000 steps in 1,222 s, 17 hours."""


def _configure(parser: argparse.ArgumentParser) -> None:
    add_number(parser, "--steps", STEPS, 20_000, "overlap-engine steps to run")
    add_number(parser, "--seed", SEED, 0, "seed of the first segment")
    add_number(parser, "--requests", REQUESTS, 24, "requests per segment")
    parser.add_argument("--progress", action="store_true", help="a line per segment")
    parser.add_argument(
        "--hicache",
        action="store_true",
        help="overlap engines with the prefix cache and its host KV tier on (engine flag "
        "hicache; a 256-slot KV pool, so blocks are evicted and loaded back), over traces "
        "whose prompts share prefixes",
    )


def _run(args: argparse.Namespace) -> int:
    plugin_manager()
    try:
        report = soak(
            args.steps,
            seed=args.seed,
            requests_per_segment=args.requests,
            progress=args.progress,
            hicache=args.hicache,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(report.format())
    return 0 if report.clean else 1


SOAK = Command(
    "a long random overlap run, every segment checked against serial tokens and sanitized",
    _configure,
    _run,
)
