"""A new engine release against the audited ones, mechanically: what ``warcore release``
computes and prints.

Given an engine integration (:class:`~warcore.integration.releases.Engine`) and a wheel of one
of its releases, read without importing it (:mod:`~warcore.integration.wheel`), and the
nearest audited release (:func:`choose_base`), :func:`compare` says per relied-on function
whether it is unchanged, its body or its signature changed, it moved to another module, or it
is gone; which watched modules the wheel lacks; which structural checks fail on its source
(:meth:`~warcore.integration.checks.Check.in_source`). :class:`Comparison` prints that, a
draft data entry (:meth:`Release.derive <warcore.integration.releases.Release.derive>` of the
audited entry, only the rows that differ, with comments on what needs a human), and the exit
status: 0 nothing changed, 1 a review is needed.

Standard library and ``packaging`` only.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .checks import Check
from .engine_code import ShapeMismatch, audit_in_source
from .releases import Engine, Release
from .wheel import FETCH_TIMEOUT_S, BadWheel, FetchFailed, SourceTree, Wheel, fetched, open_wheel

__all__ = [
    "BadInput",
    "CheckResult",
    "Comparison",
    "FunctionRow",
    "Status",
    "choose_base",
    "compare",
    "parse_target",
    "wheel_of",
]


class Status:
    """What became of a relied-on function in the new release."""

    UNCHANGED = "unchanged"
    BODY = "body changed"
    SIGNATURE = "signature changed"
    MOVED = "moved"
    GONE = "gone"
    ORDER = (UNCHANGED, BODY, SIGNATURE, MOVED, GONE)


class BadInput(ValueError):
    """Bad input to ``warcore release`` (one line naming the engine, the version, the path)."""


# -- the inputs: the wheel and the audited release to compare it with ------------------------


def parse_target(engine: Engine, text: str) -> Path | Version:
    """``text`` as a wheel's path (an existing file, or a name ending ``.whl`` or holding a
    folder separator) or as a version of ``engine``; :class:`BadInput` for neither."""
    if text.endswith(".whl") or "/" in text or os.sep in text or Path(text).exists():
        return Path(text)
    try:
        return Version(text)
    except InvalidVersion:
        raise BadInput(
            f"{engine.name}: {text!r} is neither a version nor a wheel file (a path ending .whl)"
        ) from None


@contextmanager
def wheel_of(
    engine: Engine, target: Path | Version, *, timeout: float = FETCH_TIMEOUT_S
) -> Iterator[Wheel]:
    """The wheel ``target`` names: a path used as it is, or the version fetched with ``pip
    download`` into a temporary folder that is gone when the block ends. :class:`BadInput`
    for a file that is no wheel of the engine's distribution, or a version pip cannot fetch
    (naming the engine and the version, with pip's own error line)."""
    if isinstance(target, Path):
        yield _checked(engine, target, None)
        return
    try:
        with fetched(engine.distribution, str(target), timeout=timeout) as path:
            yield _checked(engine, path, target)
    except FetchFailed as exc:
        raise BadInput(f"{engine.name} {target}: pip download fetched no wheel: {exc}") from None


def _checked(engine: Engine, path: Path, version: Version | None) -> Wheel:
    try:
        wheel = open_wheel(path)
    except BadWheel as exc:
        raise BadInput(f"{engine.name}: {exc}") from None
    if wheel.distribution != canonicalize_name(engine.distribution):
        raise BadInput(
            f"{engine.name}: {path} is a wheel of {wheel.distribution}, not of "
            f"{engine.distribution}"
        )
    if version is not None and wheel.version != version:
        raise BadInput(f"{engine.name} {version}: pip download fetched {wheel.name}")
    return wheel


def choose_base(engine: Engine, version: Version, against: str | None) -> Release:
    """The audited release to compare ``version`` with: ``against`` (an audited version,
    exactly), else the nearest: the highest audited at or below ``version``, else the lowest
    above it. :class:`BadInput` for an ``against`` that is not audited."""
    if against is not None:
        if against not in engine.releases:
            raise BadInput(
                f"{engine.name}: --against {against} is not an audited release "
                f"(audited: {', '.join(engine.releases) or 'none'})"
            )
        return engine.releases[against]
    if not engine.releases:
        raise BadInput(f"{engine.name}: no audited release to compare with")
    ordered = sorted(engine.releases.values(), key=lambda r: Version(r.version))
    below = [r for r in ordered if Version(r.version) <= version]
    return below[-1] if below else ordered[0]


# -- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class FunctionRow:
    """One relied-on function: its audited row and what the new release has."""

    module: str
    qualname: str
    audited: tuple[str, str]
    status: str
    found: tuple[str, str] | None = None
    """(signature, digest) in the new release (where it moved to, for a moved one)."""
    moved_to: tuple[str, ...] = ()
    """The modules defining it now, for a moved one (the first is the draft's)."""

    def draft_rows(self) -> dict[str, dict[str, tuple[str, str] | None]]:
        """module -> qualname -> row: what the draft entry changes for this function."""
        if self.status == Status.UNCHANGED:
            return {}
        if self.status == Status.GONE or self.found is None:
            return {self.module: {self.qualname: None}}
        # a signature-only row ("" digest) stays one
        row = (self.found[0], self.found[1] if self.audited[1] else "")
        if self.status == Status.MOVED:
            return {self.module: {self.qualname: None}, self.moved_to[0]: {self.qualname: row}}
        return {self.module: {self.qualname: row}}

    def detail(self) -> str:
        (old_signature, old_digest), found = self.audited, self.found
        if self.status == Status.BODY and found is not None:
            return f"digest {old_digest} -> {found[1]}"
        if self.status == Status.SIGNATURE and found is not None:
            return f"{old_signature} -> {found[0]}"
        if self.status == Status.MOVED:
            return f"now in {', '.join(self.moved_to)}"
        if self.status == Status.GONE:
            return "no module of the wheel defines it"
        return ""


@dataclass(frozen=True)
class CheckResult:
    module: str
    name: str
    failure: str | None
    """``None``: the check holds in the new release's source."""


def _audit(source: str | None, qualname: str) -> tuple[str, str] | None:
    """(signature, digest) of ``qualname`` in ``source``; ``None`` where it is not defined
    there (or the module does not parse)."""
    if source is None:
        return None
    try:
        return audit_in_source(source, qualname)
    except (LookupError, SyntaxError, ValueError, RecursionError, ShapeMismatch):
        return None


def _function_row(
    tree: SourceTree, module: str, qualname: str, audited: tuple[str, str]
) -> FunctionRow:
    found = _audit(tree.source(module), qualname)
    if found is None:
        *owners, name = qualname.split(".")
        words = [f"def {name}", *(f"class {owner}" for owner in owners[:1])]
        elsewhere = [
            m for m in tree.mentioning(*words) if m != module and _audit(tree.source(m), qualname)
        ]
        if not elsewhere:
            return FunctionRow(module, qualname, audited, Status.GONE)
        moved = _audit(tree.source(elsewhere[0]), qualname)
        return FunctionRow(module, qualname, audited, Status.MOVED, moved, tuple(elsewhere))
    if found[0] != audited[0]:
        return FunctionRow(module, qualname, audited, Status.SIGNATURE, found)
    if audited[1] and found[1] != audited[1]:
        return FunctionRow(module, qualname, audited, Status.BODY, found)
    return FunctionRow(module, qualname, audited, Status.UNCHANGED, found)


def _check_result(tree: SourceTree, module: str, check: Check) -> CheckResult:
    try:
        check.in_source(tree, module)
    except ShapeMismatch as exc:
        return CheckResult(module, check.name, str(exc))
    except Exception as exc:  # a source this reader cannot follow: a human reads it
        return CheckResult(module, check.name, f"not evaluated from source: {exc!r}")
    return CheckResult(module, check.name, None)


def compare(engine: Engine, wheel: Wheel, tree: SourceTree, base: Release) -> Comparison:
    """The wheel's release (its sources: ``tree``) against the audited entry ``base``."""
    rows = tuple(
        _function_row(tree, module, qualname, audited)
        for module, functions in base.functions.items()
        for qualname, audited in functions.items()
    )
    checks = tuple(
        _check_result(tree, module, check)
        for module, module_checks in base.checks.items()
        for check in module_checks
    )
    missing = tuple(m for m in base.watched if not tree.is_module(m))
    return Comparison(engine, wheel, base, rows, missing, checks)


# -- what is printed --------------------------------------------------------------------------


def _columns(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns, two spaces apart; the last one not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    cells = ([c.ljust(w) for c, w in zip(row, widths, strict=False)] + [row[-1]] for row in rows)
    return [(indent + "  ".join(line)).rstrip() for line in cells]


def _grouped(rows: list[tuple[str, list[str]]]) -> list[str]:
    """(module, cells) rows as one table, a line naming each module before its rows."""
    lines: list[str] = []
    table = _columns([cells for _, cells in rows], "    ")
    for index, (module, _) in enumerate(rows):
        if index == 0 or rows[index - 1][0] != module:
            lines.append(f"  {module}")
        lines.append(table[index])
    return lines


def _literal(text: str) -> str:
    return json.dumps(text)  # a double-quoted string Python reads as it is


def _pieces(text: str, width: int) -> list[str]:
    """``text`` cut at spaces into pieces of about ``width`` characters that join back to it
    (adjacent string literals)."""
    return textwrap.wrap(text, width, drop_whitespace=False, break_long_words=False) or [""]


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 96 - len(indent))]


def _variable(release: Release, data_module: str) -> str:
    """The data module's name for ``release`` (found by identity where that module is
    imported), else the convention ``_0_5_23``."""
    module = sys.modules.get(data_module)
    for name, value in vars(module).items() if module is not None else ():
        if value is release and name.startswith("_"):
            return name
    return "_" + "".join(c if c.isalnum() else "_" for c in release.version)


@dataclass(frozen=True)
class Comparison:
    """A wheel's release against an audited entry: what :func:`compare` found."""

    engine: Engine
    wheel: Wheel
    base: Release
    rows: tuple[FunctionRow, ...]
    missing_watched: tuple[str, ...]
    """Watched modules the wheel does not have."""
    checks: tuple[CheckResult, ...]

    @property
    def version(self) -> str:
        return str(self.wheel.version)

    @property
    def changed(self) -> list[FunctionRow]:
        return [row for row in self.rows if row.status != Status.UNCHANGED]

    @property
    def failing(self) -> list[CheckResult]:
        return [check for check in self.checks if check.failure is not None]

    @property
    def needs_review(self) -> bool:
        return bool(self.changed or self.missing_watched or self.failing)

    @property
    def exit_status(self) -> int:
        """0 nothing changed, 1 a review is needed."""
        return 1 if self.needs_review else 0

    def report(self, today: datetime.date | None = None) -> str:
        """Everything: the functions, the watched modules, the checks, the verdict and the
        draft entry (none for an audited release that matches its own entry)."""
        lines = [
            f"{self.engine.name} {self.version} ({self.wheel.name}, sha256 "
            f"{self.wheel.sha256[:16]}...) against the audited {self.base.version}",
            "",
            *self._function_lines(),
            "",
            *self._watched_lines(),
            "",
            *self._check_lines(),
            "",
            self._verdict(),
        ]
        if self.needs_review or self.version != self.base.version:
            lines += ["", *self.draft(today).splitlines()]
        return "\n".join(lines)

    def _function_lines(self) -> list[str]:
        counts = ", ".join(f"{sum(row.status == s for row in self.rows)} {s}" for s in Status.ORDER)
        table = [(row.module, [row.status, row.qualname, row.detail()]) for row in self.rows]
        return [f"relied-on functions: {len(self.rows)} ({counts})", *_grouped(table)]

    def _watched_lines(self) -> list[str]:
        watched = self.base.watched
        if not self.missing_watched:
            return [f"watched modules: {len(watched)}, every one in this wheel"]
        head = f"watched modules: {len(watched)}, {len(self.missing_watched)} not in this wheel"
        table = [["not in this wheel", f"{m} (step {watched[m]!r})"] for m in self.missing_watched]
        return [head, *_columns(table)]

    def _check_lines(self) -> list[str]:
        if not self.checks:
            return ["structural checks: none recorded"]
        head = f"structural checks: {len(self.checks)}, {len(self.failing)} failing"
        table = [
            (c.module, ["FAIL" if c.failure else "ok", c.failure or c.name]) for c in self.checks
        ]
        return [head, *_grouped(table)]

    def _verdict(self) -> str:
        if not self.needs_review:
            if self.version == self.base.version:
                return f"nothing changed: {self.version} matches its audited entry"
            return f"nothing changed against {self.base.version}: the draft entry below is all"
        parts = [
            (len(self.changed), "relied-on function(s) differ"),
            (len(self.missing_watched), "watched module(s) missing"),
            (len(self.failing), "check(s) fail"),
        ]
        return "review needed: " + "; ".join(f"{n} {what}" for n, what in parts if n)

    def draft(self, today: datetime.date | None = None) -> str:
        """The draft entry, as Python :attr:`Engine.data_module` takes as it is: the audited
        entry's ``derive`` with the rows that differ (a gone one ``None``), comments on what
        needs a human, and its evidence."""
        data = self.engine.data_module
        base = _variable(self.base, data)
        new = "_" + "".join(c if c.isalnum() else "_" for c in self.version)
        lines = [
            f"# draft entry for {data}: review it first (docs/releases.md)",
            f"{new} = {base}.derive(",
            f"    {_literal(self.version)},",
            *self._draft_functions(),
            *self._draft_notes(),
            "    evidence=(",
            *(f"        {_literal(p)}" for p in _pieces(self._evidence(today), 84)),
            "    ),",
            ")",
        ]
        return "\n".join(lines)

    def _draft_functions(self) -> list[str]:
        table: dict[str, dict[str, tuple[FunctionRow, tuple[str, str] | None]]] = {}
        for row in self.changed:
            for module, rows in row.draft_rows().items():
                for qualname, value in rows.items():
                    table.setdefault(module, {})[qualname] = (row, value)
        if not table:
            return []
        lines = ["    functions={"]
        for module, entries in table.items():
            lines.append(f"        {_literal(module)}: {{")
            for qualname, (function, value) in entries.items():
                lines += _draft_row(qualname, function, value)
            lines.append("        },")
        return [*lines, "    },"]

    def _draft_notes(self) -> list[str]:
        notes = [
            f"watched module {m} (step {self.base.watched[m]!r}) is not in this wheel: "
            "decide what replaces it (watched=...)"
            for m in self.missing_watched
        ]
        notes += [f"check fails in {c.module}: {c.failure}" for c in self.failing]
        return [line for note in notes for line in _comment(f"REVIEW: {note}", "    ")]

    def _evidence(self, today: datetime.date | None) -> str:
        day = (today or datetime.date.today()).isoformat()
        return (
            f"{self.wheel.name} (sha256 {self.wheel.sha256}): drafted by warcore release on "
            f"{day} against the audited {self.base.version}; review: read each changed row "
            "against this wheel's source, then run this release's sessions"
        )


def _draft_row(qualname: str, row: FunctionRow, value: tuple[str, str] | None) -> list[str]:
    indent = "            "
    if row.status == Status.MOVED and value is None:
        note = f"REVIEW: moved to {', '.join(row.moved_to)} (watched there? patched there?)"
    elif row.status == Status.MOVED:
        note = f"REVIEW: moved here from {row.module}"
    else:
        note = f"{row.status}: {row.detail()}"
    lines = _comment(note, indent)
    if value is None:
        return [*lines, f"{indent}{_literal(qualname)}: None,"]
    signature, digest = value
    return [
        *lines,
        f"{indent}{_literal(qualname)}: (",
        f"{indent}    {_literal(signature)},",
        f"{indent}    {_literal(digest)},",
        f"{indent}),",
    ]
