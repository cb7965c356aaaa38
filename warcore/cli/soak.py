"""``warcore soak``: a long random overlap run, every segment checked against serial tokens
and sanitized (:func:`warcore.audit.soak.soak`)."""

from __future__ import annotations

import argparse

from warcore.audit.soak import soak
from warcore.cli._common import Command, UsageError, check_count, plugin_manager

__all__ = ["SOAK"]


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20_000, help="overlap-engine steps to run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first segment")
    parser.add_argument(
        "--requests",
        type=int,
        default=24,
        help="requests per segment (1 to 100,000)",
    )
    parser.add_argument("--progress", action="store_true", help="a line per segment")


def _run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    check_count("--requests", args.requests, _max_requests())
    plugin_manager()
    try:
        report = soak(
            args.steps, seed=args.seed, requests_per_segment=args.requests, progress=args.progress
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


def _max_requests() -> int:
    from warcore.engine.requests import MAX_TRACE_REQUESTS  # the engine imports torch

    return MAX_TRACE_REQUESTS
