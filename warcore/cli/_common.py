"""What every command module shares: the :class:`Command` record, usage errors, the plugin
manager behind a validated environment, and plain-text and JSON output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warcore.core import LoaderConfig, WarcorePluginManager, get_plugin_manager
from warcore.core._specs import FlagValue

__all__ = [
    "PROG",
    "Command",
    "UsageError",
    "parse_flag",
    "plugin_manager",
    "print_json",
    "print_table",
]

PROG = "warcore"


@dataclass(frozen=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """Bad input from the user (arguments or environment): one line on stderr, exit 2."""


def plugin_manager() -> WarcorePluginManager:
    # Validate the environment here, so a malformed variable is a usage error naming it rather
    # than a traceback from deep inside plugin loading.
    try:
        LoaderConfig.from_env()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return get_plugin_manager()


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in col) for col in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        cells = [str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=False)] + [str(line[-1])]
        print("  ".join(cells).rstrip())


def parse_flag(text: str) -> tuple[str, FlagValue]:
    name, sep, raw = text.partition("=")
    if not name:
        raise UsageError(f"--flag {text!r}: expected NAME or NAME=VALUE")
    if not sep or raw.lower() in ("1", "true", "yes", "on"):
        return name, True
    if raw.lower() in ("0", "false", "no", "off"):
        return name, False
    try:
        return name, int(raw)
    except ValueError:
        return name, raw
