"""What every command module shares: the :class:`Command` record, usage errors, the plugin
manager behind a validated environment, and plain-text and JSON output."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from warcore._files import probe_writable, write_text
from warcore.core import (
    DuplicateNameError,
    FlagSpec,
    FlagValue,
    LoaderConfig,
    UnknownNameError,
    WarcorePluginManager,
    check_flags,
    get_plugin_manager,
    get_registry,
    parse_decimal,
)

__all__ = [
    "PROG",
    "Command",
    "UsageError",
    "FRACTION",
    "MILLISECONDS",
    "REPEAT",
    "REQUESTS",
    "SEED",
    "Limit",
    "Parser",
    "add_event_options",
    "add_number",
    "check_offered",
    "check_writable",
    "one_line",
    "parse_flag",
    "parse_flags",
    "plugin_manager",
    "print_json",
    "print_table",
    "writing",
]

PROG = "warcore"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """``text`` with its control characters escaped as Python writes them (a newline in a
    path is ``\\n``): an error stays the one line a script reads, and prints no terminal
    escapes."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the option, the value, the limit) and exit 2,
    like every other bad input: no usage block before it; ``--help`` shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


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


def check_offered(pm: WarcorePluginManager, kind: str, name: str) -> None:
    """``name`` is a usable backend or algorithm (``kind``), else a :class:`UsageError`: the
    registry's (unknown, listing the valid ones; or disabled as offered twice), and when
    ``WARCORE_DISABLE_PLUGINS`` or ``WARCORE_PLUGINS`` kept a plugin from loading, which one
    and by which variable. A plugin that is not loaded is not asked what it offers, so a
    plugin whose name matches ``name`` (``trtllm_mha``, or the ``sglang`` of
    ``sglang_flashinfer``) is said to disable it; otherwise the line lists the plugins not
    asked. Torch-free: commands call it before they import the engine."""
    registry = get_registry(pm)
    try:
        registry.backend(name) if kind == "backend" else registry.algorithm(name)
    except DuplicateNameError as exc:
        raise UsageError(str(exc)) from None
    except UnknownNameError as exc:
        off = [i for i in pm.plugin_infos if i.status == "disabled" and i.value is not None]
        mine = [i for i in off if _plugin_names(i.name, i.distribution, name)]
        if mine:
            who = "; ".join(f"plugin {_who(i.name, i.distribution)} is {i.error}" for i in mine)
            raise UsageError(f"{kind} {name!r} is disabled: {who}") from None
        if off:
            who = ", ".join(f"{_who(i.name, i.distribution)} ({i.error})" for i in off)
            raise UsageError(f"{exc}; plugins not loaded, so not asked: {who}") from None
        raise UsageError(str(exc)) from None


def _who(plugin: str, distribution: str | None) -> str:
    return f"{plugin!r} ({distribution})" if distribution else repr(plugin)


def _canonical(text: str) -> str:
    return text.lower().replace("-", "_").replace(".", "_")


def _plugin_names(plugin: str, distribution: str | None, name: str) -> bool:
    """Whether ``name`` is the plugin's own name: its entry point's or its distribution's
    (without a ``warcore-`` prefix), alone or as the ``<plugin>_`` prefix of the name."""
    own = {_canonical(plugin)}
    if distribution:
        own |= {_canonical(distribution), _canonical(distribution).removeprefix("warcore_")}
    return any(_canonical(name) == n or _canonical(name).startswith(n + "_") for n in own)


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in col) for col in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        cells = [str(c).ljust(w) for c, w in zip(line[:-1], widths, strict=False)] + [str(line[-1])]
        print("  ".join(cells).rstrip())


BOOL_TRUE = ("1", "true", "yes", "on")
BOOL_FALSE = ("0", "false", "no", "off")
BOOL_SPELLINGS = "1/0, true/false, yes/no, on/off"
"""The spellings a boolean flag accepts on the command line (any case); a bare ``NAME`` means
true. The same as the ``WARCORE_*`` boolean variables."""


def parse_flag_text(text: str, specs: Mapping[str, FlagSpec]) -> tuple[str, FlagValue]:
    """``NAME`` or ``NAME=VALUE`` (the command line's ``--flag``), parsed by the flag's kind.

    A boolean accepts :data:`BOOL_SPELLINGS` (a bare name: true); an integer flag an integer;
    a string flag any text (it needs ``=VALUE``). Raises :class:`ValueError` naming the flag
    (and, for an unknown one, the valid names, as the engine's own check does)."""
    name, sep, raw = text.partition("=")
    if not name:
        raise ValueError(f"--flag {text!r}: expected NAME or NAME=VALUE")
    spec = specs.get(name)
    if spec is None:
        valid = ", ".join(sorted(specs)) or "(none)"
        close = difflib.get_close_matches(name, list(specs), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"--flag {text!r}: unknown engine flag {name!r}{hint}; valid: {valid}")
    kind = spec.kind.__name__
    if spec.kind is bool:
        if not sep or raw.lower() in BOOL_TRUE:
            return name, True
        if raw.lower() in BOOL_FALSE:
            return name, False
        raise ValueError(
            f"--flag {text!r}: {name} is a boolean flag; its value must be one of "
            f"{BOOL_SPELLINGS}, got {raw!r}"
        )
    if not sep:
        raise ValueError(f"--flag {text!r}: {name} is a {kind} flag and needs a value")
    if spec.kind is int:
        try:  # the range is the flag's own (FlagSpec.bounds), checked as the API checks it
            value = parse_decimal(raw)
            check_flags({name: value}, specs)
        except ValueError as exc:
            raise ValueError(f"--flag {text!r}: {name} is an int flag: {exc}") from None
        return name, value
    return name, raw


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
    values is an error, and so are wrapper children that name no usable backend or make a
    wrapper its own child (:func:`~warcore.attention.composite.check_engine_flags`, which
    ``build_matrix`` calls too): the same line from ``run``, ``sanitize`` and ``matrix``, before
    anything is built."""
    if not texts:
        return {}
    from warcore.attention.composite import check_engine_flags  # no torch: a name check

    pm = plugin_manager()
    specs = get_registry(pm).flag_specs()
    flags: dict[str, FlagValue] = {}
    for text in texts:
        name, value = parse_flag(text, specs)
        if name in flags and flags[name] != value:
            raise UsageError(f"--flag {name} is given twice: {flags[name]!r} and {value!r}")
        flags[name] = value
    try:
        return check_engine_flags(flags, pm)  # what the Python API checks too
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# -- argument types and checks made before anything is measured ---------------------------


@dataclass(frozen=True)
class Limit:
    """An argparse ``type`` for a numeric option: an ``int`` (or, with ``kind=float``, a finite
    number) from ``least`` to ``most``. Anything else is refused while parsing: argparse names
    the option, this says the limits (and ``why``, when the limit has a reason beyond "more is
    a typo"). Every numeric option of every command has one (README: Command line)."""

    kind: type[int] | type[float]
    least: int | float
    most: int | float
    why: str = ""

    @property
    def __name__(self) -> str:  # argparse's "invalid int value: 'many'"
        return self.kind.__name__

    def __call__(self, text: str) -> int | float:
        # ValueError: argparse says "invalid int value"; an int is plain decimal digits only
        value = parse_decimal(text) if self.kind is int else _plain_float(text)
        if not math.isfinite(value) or not self.least <= value <= self.most:
            raise argparse.ArgumentTypeError(f"{self.describe()}, got {text!r}{self.why}")
        return value

    def describe(self) -> str:
        if self.kind is int:
            return f"must be at least {self.least:,} and at most {self.most:,}"
        return f"expected a finite number >= {self.least:g} and at most {self.most:,g}"

    @property
    def range(self) -> str:
        """``least to most``, as the help and the README say it."""
        return (
            f"{self.least:,} to {self.most:,}"
            if self.kind is int
            else f"{self.least:g} to {self.most:,g}"
        )


_PLAIN_FLOAT = re.compile(
    r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:nan|inf|infinity)",
    re.IGNORECASE,  # nan and inf are numbers, refused by the range check as not finite
)


def _plain_float(text: str) -> float:
    """``text`` as a float if it is a plain decimal number (``2``, ``0.5``, ``.5``, ``1e-3``);
    ``float()`` also takes ``1_0``, surrounding spaces and other scripts' digits, typos on a
    command line, as :func:`~warcore.core.parse_decimal` refuses them for an int."""
    if not _PLAIN_FLOAT.fullmatch(text):
        raise ValueError(f"expected a plain decimal number, got {text!r}")
    return float(text)


REQUESTS = Limit(int, 1, 100_000)
"""``--requests``: ``warcore.engine.MAX_TRACE_REQUESTS`` (a test ties the two; the engine
imports torch, the parser must not)."""
SEED = Limit(int, 0, 2**32 - 1)
REPEAT = Limit(int, 1, 1_000)
MILLISECONDS = Limit(float, 0.0, 1_000.0)
"""Modelled device time (``--layer-ms``, ``--schedule-ms``): up to a second per layer or step."""
FRACTION = Limit(float, 0.0, 10.0)
"""Scheduler work as a fraction of the forward's time (``--sched-frac``, ``--fractions``)."""


def add_number(
    parser: argparse.ArgumentParser,
    option: str,
    limit: Limit,
    default: int | float,
    help_text: str,
) -> None:
    """``option`` with ``limit`` as its type and its range at the end of its help."""
    parser.add_argument(option, type=limit, default=default, help=f"{help_text} ({limit.range})")


def add_event_options(parser: argparse.ArgumentParser) -> None:
    """``--copy-wait`` and ``--in-graph-event`` (``EngineConfig.copy_wait``,
    ``.in_graph_event``), for every command that builds engines with captured graphs."""
    parser.add_argument(
        "--copy-wait",
        choices=("none", "at-barrier", "after-next-launch"),
        default="none",
        help="a second consumer of the read-done event on a copy stream (sanitize: in its "
        "binding run): waits at the barrier, or only after the next step is launched (sglang "
        "#31072's shape: the binding audit warns)",
    )
    parser.add_argument(
        "--in-graph-event",
        choices=("persistent", "ring"),
        default="persistent",
        help="the captured graphs' read-done event: one persistent event re-armed by every "
        "replay (default), or a ring of captured nodes, one graph per slot and bucket "
        "(EngineConfig.in_graph_event)",
    )


def check_writable(
    option: str, path: str | os.PathLike[str], *, make_parents: bool = False
) -> None:
    """Fail now, naming ``option``, if a file cannot be written at ``path`` — before minutes
    of measuring, not after. Found by trying: a file is created beside it and removed
    (``os.access`` says yes to root where ``/proc`` still refuses); ``path`` itself is not
    changed. With ``make_parents`` missing folders are fine if they can be created (they are
    created to try, and removed again)."""
    target = Path(path)
    with writing(option, path):  # a name the file system refuses (too long) is one line too
        if target.is_dir():
            raise UsageError(f"{option} {path}: is a directory; give a file name")
        parent = target.parent
        while make_parents and not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.exists():
            raise UsageError(f"{option} {path}: folder {target.parent} does not exist")
        if not parent.is_dir():
            raise UsageError(f"{option} {path}: {parent} is not a folder")
    try:
        probe_writable(target, make_parents=make_parents)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot create a file there ({exc.strerror})") from None


@contextmanager
def writing(option: str, path: str | os.PathLike[str]) -> Iterator[None]:
    """An output file that cannot be written (checked, or while written: ``/dev/full``) is one
    line naming ``option`` and ``path`` (a :class:`UsageError`), not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


def write_output(option: str, path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to the file ``option`` named, whole or not at all; a failure is a
    :class:`UsageError` naming both (for plugins' commands too: :mod:`warcore.cli` exports it)."""
    with writing(option, path):
        write_text(path, text)


class JsonOutput:
    """A plugin command's ``--json FILE``: tried before anything is measured (a folder, a
    full disk: one line, exit 2, never after minutes of work), written whole at the end."""

    def __init__(
        self, parser: argparse.ArgumentParser, path: str | os.PathLike[str] | None
    ) -> None:
        self.parser, self.path = parser, path
        if path:
            try:
                check_writable("--json", path, make_parents=True)
            except UsageError as exc:
                parser.error(str(exc))

    def write(self, doc: object) -> int:
        """0, or one line naming the file and 2."""
        if not self.path:
            return 0
        try:
            write_output("--json", self.path, json.dumps(doc, indent=2) + "\n")
        except UsageError as exc:
            print(f"{self.parser.prog}: {one_line(str(exc))}", file=sys.stderr)
            return 2
        return 0
