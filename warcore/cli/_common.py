"""What every command module shares: the :class:`Command` record, usage errors, the plugin
manager behind a validated environment, and plain-text and JSON output."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from warcore.core import (
    FlagSpec,
    LoaderConfig,
    WarcorePluginManager,
    get_plugin_manager,
    get_registry,
)
from warcore.core._flags import parse_flag_text
from warcore.core._specs import FlagValue

__all__ = [
    "PROG",
    "Command",
    "UsageError",
    "check_count",
    "check_writable",
    "non_negative_float",
    "parse_flag",
    "parse_flags",
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


def parse_flag(text: str, specs: Mapping[str, FlagSpec] | None = None) -> tuple[str, FlagValue]:
    """``--flag NAME[=VALUE]``, checked against the declared flags (``specs``; by default the
    core's and the installed plugins' own, ``Registry.flags``): an unknown name or a value that
    is not of the flag's kind is a :class:`UsageError` naming the flag and the valid ones.
    Booleans accept 1/0, true/false, yes/no, on/off (a bare ``NAME``: true)."""
    if specs is None:
        specs = get_registry(plugin_manager()).flag_specs()
    try:
        return parse_flag_text(text, specs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_flags(texts: Sequence[str]) -> dict[str, FlagValue]:
    """Every ``--flag`` of a command (see :func:`parse_flag`); a flag given twice with two
    values is an error."""
    if not texts:
        return {}
    specs = get_registry(plugin_manager()).flag_specs()
    flags: dict[str, FlagValue] = {}
    for text in texts:
        name, value = parse_flag(text, specs)
        if name in flags and flags[name] != value:
            raise UsageError(f"--flag {name} is given twice: {flags[name]!r} and {value!r}")
        flags[name] = value
    return flags


# -- argument types and checks made before anything is measured ---------------------------


def non_negative_float(text: str) -> float:
    """An argparse ``type``: a finite number >= 0 (``nan``, ``inf`` and negatives are rejected
    while parsing, with the option named by argparse)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def check_count(option: str, value: int, limit: int, least: int = 1) -> None:
    """``value`` of ``option`` within ``least``..``limit``, else a :class:`UsageError`."""
    if not least <= value <= limit:
        raise UsageError(f"{option} must be at least {least} and at most {limit:,}, got {value:,}")


def check_writable(
    option: str, path: str | os.PathLike[str], *, make_parents: bool = False
) -> None:
    """Fail now, naming ``option``, if a file cannot be written at ``path`` — before minutes
    of measuring, not after. The file itself is not created (nor an existing one changed);
    with ``make_parents`` missing folders are fine if they could be created (they are not)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give a file name")
    if target.exists():
        if not os.access(target, os.W_OK):
            raise UsageError(f"{option} {path}: not writable")
        return
    parent = target.parent
    while make_parents and not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.exists():
        raise UsageError(f"{option} {path}: folder {target.parent} does not exist")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: folder {parent} is not writable")
