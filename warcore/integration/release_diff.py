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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from .checks import Check
from .engine_code import ShapeMismatch
from .releases import Engine, Release
from .surface import Difference, compute, differences, load
from .wheel import FETCH_TIMEOUT_S, BadWheel, FetchFailed, SourceTree, Wheel, fetched, open_wheel

__all__ = [
    "BadInput",
    "CheckResult",
    "Comparison",
    "FunctionRow",
    "Status",
    "SurfaceResult",
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
    folder separator) or as a version of ``engine``; :class:`BadInput` for neither (a text
    the file system refuses as a name, longer than it allows, is no existing file)."""
    if text.endswith(".whl") or "/" in text or os.sep in text or _exists(text):
        return Path(text)
    try:
        return Version(text)
    except ValueError:  # InvalidVersion, or a number of more than 4,300 digits
        raise BadInput(
            f"{engine.name}: {_clipped(text)} is neither a version nor a wheel file (a path "
            "ending .whl)"
        ) from None


def _exists(text: str) -> bool:
    try:
        return Path(text).exists()
    except OSError:  # ENAMETOOLONG
        return False


def _clipped(text: str, most: int = 80, show: Callable[[str], str] = repr) -> str:
    """``text`` shown (quoted), cut to ``most`` characters: a 10 kB argument is not echoed."""
    return show(text) if len(text) <= most else f"{text[:most]!r}... ({len(text):,} characters)"


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
    above it. :class:`BadInput` for an ``against`` that is not audited, for a development or
    local build (``0.0.0.dev0``, ``0.5.23+g1234``: its version says nothing of its code)
    without ``against``, and for an audited entry whose version is not one."""
    if against is not None:
        if against not in engine.releases:
            raise BadInput(
                f"{engine.name}: --against {_clipped(against, show=str)} is not an audited release "
                f"(audited: {', '.join(engine.releases) or 'none'})"
            )
        return engine.releases[against]
    if not engine.releases:
        raise BadInput(f"{engine.name}: no audited release to compare with")
    if _build_note(version):
        raise BadInput(
            f"{engine.name} {version} is a development or local build: its version says "
            "nothing of its code, so no audited release is nearest; give one with --against "
            f"(audited: {', '.join(engine.releases)})"
        )
    versions = {r.version: _audited_version(engine, r) for r in engine.releases.values()}
    ordered = sorted(engine.releases.values(), key=lambda r: versions[r.version])
    below = [r for r in ordered if versions[r.version] <= version]
    return below[-1] if below else ordered[0]


def _audited_version(engine: Engine, release: Release) -> Version:
    try:
        return Version(release.version)
    except ValueError:
        raise BadInput(
            f"{engine.name}: the audited entry {_clipped(release.version)} of "
            f"{engine.data_module} is not a valid version"
        ) from None


def _build_note(version: Version) -> str:
    """What the report says of a development or local build, else ``""``."""
    if version.is_devrelease or version.local is not None:
        return " (a development or local build: compared only as --against asked)"
    return ""


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
    """The modules defining it now, for a moved one (the first is the draft's); for a gone
    one, those defining other code under its name (not it: its digest differs)."""
    moved_as: str = ""
    """Its qualified name where it moved, when that differs: the base class of its class
    that now defines it (``Mixin.method``)."""

    def draft_rows(self) -> dict[str, dict[str, tuple[str, str] | None]]:
        """module -> qualname -> row: what the draft entry changes for this function."""
        if self.status == Status.UNCHANGED:
            return {}
        if self.status == Status.GONE or self.found is None:
            return {self.module: {self.qualname: None}}
        # a signature-only row ("" digest) stays one
        row = (self.found[0], self.found[1] if self.audited[1] else "")
        if self.status == Status.MOVED:  # the row kept, where Python now finds the function
            rows: dict[str, dict[str, tuple[str, str] | None]] = {
                self.module: {self.qualname: None}
            }
            rows.setdefault(self.moved_to[0], {})[self.moved_as or self.qualname] = row
            return rows
        return {self.module: {self.qualname: row}}

    def detail(self) -> str:
        (old_signature, old_digest), found = self.audited, self.found
        if self.status == Status.BODY and found is not None:
            return f"digest {old_digest} -> {found[1]}"
        if self.status == Status.SIGNATURE and found is not None:
            return f"{old_signature} -> {found[0]}"
        if self.status == Status.MOVED:
            where = f"now in {', '.join(self.moved_to)}"
            if self.moved_as:
                where += f" as {self.moved_as}, a base of {self.qualname.rpartition('.')[0]}"
            if found is not None and found[0] != old_signature:
                return f"{where}; {old_signature} -> {found[0]}"
            if found is not None and old_digest and found[1] != old_digest:
                return f"{where}; digest {old_digest} -> {found[1]}"
            return where
        if self.status == Status.GONE and self.moved_to:
            return f"none has its audited code; other code of that name: {', '.join(self.moved_to)}"
        if self.status == Status.GONE:
            return "no module of the wheel defines it"
        return ""


@dataclass(frozen=True)
class CheckResult:
    module: str
    name: str
    failure: str | None
    """``None``: the check holds in the new release's source."""


def _function_row(
    tree: SourceTree, module: str, qualname: str, audited: tuple[str, str]
) -> FunctionRow:
    found = tree.function(module, qualname)  # what Python runs: the last def, a package first
    if found is None:
        return _missing_row(tree, module, qualname, audited)
    if found[0] != audited[0]:
        return FunctionRow(module, qualname, audited, Status.SIGNATURE, found)
    if audited[1] and found[1] != audited[1]:
        return FunctionRow(module, qualname, audited, Status.BODY, found)
    return FunctionRow(module, qualname, audited, Status.UNCHANGED, found)


def _missing_row(
    tree: SourceTree, module: str, qualname: str, audited: tuple[str, str]
) -> FunctionRow:
    """A function its module no longer defines: ``moved`` into a base class of its class
    (the method Python finds through the bases), or to another module that defines it with
    its audited code (its digest; a signature-only row: its signature), else ``gone``,
    naming the modules that define other code under its name."""
    base = tree.inherited(module, qualname)
    if base is not None:
        moved = tree.function(*base)
        return FunctionRow(module, qualname, audited, Status.MOVED, moved, (base[0],), base[1])
    others = {m: row for m, row in tree.definitions(qualname).items() if m != module}
    same = [m for m, row in others.items() if _same_code(row, audited)]
    if same:
        return FunctionRow(module, qualname, audited, Status.MOVED, others[same[0]], tuple(same))
    return FunctionRow(module, qualname, audited, Status.GONE, moved_to=tuple(others))


def _same_code(found: tuple[str, str], audited: tuple[str, str]) -> bool:
    """``found`` is the audited function: its digest, or, for a signature-only row (digest
    ``""``), its signature."""
    return found[1] == audited[1] if audited[1] else found[0] == audited[0]


def _check_result(tree: SourceTree, module: str, check: Check) -> CheckResult:
    try:
        check.in_source(tree, module)
    except ShapeMismatch as exc:
        return CheckResult(module, check.name, str(exc))
    except Exception as exc:  # a source this reader cannot follow: a human reads it
        return CheckResult(module, check.name, f"not evaluated from source: {exc!r}")
    return CheckResult(module, check.name, None)


@dataclass(frozen=True)
class SurfaceResult:
    """The wheel's WAR surface against the base release's recorded one."""

    base_file: Path
    differences: tuple[Difference, ...]
    unread: str | None = None
    """Why the base's surface was not compared (its file absent or unreadable)."""


def compare_surface(engine: Engine, tree: SourceTree, base: Release) -> SurfaceResult | None:
    """The engine's surface of ``tree`` against ``base``'s file; ``None`` for an engine that
    declares no surface."""
    if not engine.surface:  # before surface_file: it looks for the data module
        return None
    path = engine.surface_file(base.version)
    if path is None:
        return None
    try:
        recorded, _ = load(path)
    except ValueError as exc:
        why = "not recorded" if not path.exists() else str(exc)
        return SurfaceResult(path, (), why)
    return SurfaceResult(path, tuple(differences(recorded, compute(engine.surface, tree))))


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
    surface = compare_surface(engine, tree, base)
    return Comparison(engine, wheel, base, rows, missing, checks, surface)


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
    surface: SurfaceResult | None = None

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
    def surface_differences(self) -> tuple[Difference, ...]:
        return self.surface.differences if self.surface is not None else ()

    @property
    def surface_unread(self) -> bool:
        return self.surface is not None and self.surface.unread is not None

    @property
    def needs_review(self) -> bool:
        differ = self.surface_differences or self.surface_unread
        return bool(self.changed or self.missing_watched or self.failing or differ)

    @property
    def exit_status(self) -> int:
        """0 nothing changed, 1 a review is needed."""
        return 1 if self.needs_review else 0

    def report(self, today: datetime.date | None = None) -> str:
        """Everything: the functions, the watched modules, the checks, the verdict and the
        draft entry (none for an audited release that matches its own entry)."""
        lines = [
            f"{self.engine.name} {self.version} ({self.wheel.name}, sha256 "
            f"{self.wheel.sha256[:16]}...) against the audited {self.base.version}"
            + _build_note(self.wheel.version),
            "",
            *self._function_lines(),
            "",
            *self._watched_lines(),
            "",
            *self._check_lines(),
            "",
            *self._surface_lines(),
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

    def _surface_lines(self) -> list[str]:
        result = self.surface
        if result is None:
            return []
        base = f"{self.base.version}'s ({result.base_file.name})"
        if result.unread is not None:
            return [f"WAR surface: {base} {result.unread}: not compared", ""]
        found = result.differences
        kinds = ", ".join(
            f"{sum(d.kind == k for d in found)} {k}" for k in ("added", "removed", "changed")
        )
        lines = [f"WAR surface against {base}: {len(found)} differ ({kinds})"]
        for index, difference in enumerate(found):
            if index == 0 or found[index - 1].section != difference.section:
                lines.append(f"  {difference.section}")
            lines.append(f"    {difference.kind:<8} {difference.key}: {_shown(difference)}")
        return [*lines, ""]

    def _verdict(self) -> str:
        if not self.needs_review:
            if self.version == self.base.version:
                return f"nothing changed: {self.version} matches its audited entry"
            return f"nothing changed against {self.base.version}: the draft entry below is all"
        parts = [
            (len(self.changed), "relied-on function(s) differ"),
            (len(self.missing_watched), "watched module(s) missing"),
            (len(self.failing), "check(s) fail"),
            (len(self.surface_differences), "WAR surface entr(ies) differ"),
            (int(self.surface_unread), "WAR surface not compared"),
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
        notes += [f"surface: {_cut(d.line())}" for d in self.surface_differences]
        if self.surface is not None and self.surface.unread is not None:
            notes.append(f"surface: {self.surface.base_file} {self.surface.unread}")
        return [line for note in notes for line in _comment(f"REVIEW: {note}", "    ")]

    def _evidence(self, today: datetime.date | None) -> str:
        day = (today or datetime.date.today()).isoformat()
        return (
            f"{self.wheel.name} (sha256 {self.wheel.sha256}): drafted by warcore release on "
            f"{day} against the audited {self.base.version}; review: read each changed row "
            "against this wheel's source, then run this release's sessions"
        )


_SHOWN = 240
"""Characters of a surface entry shown (its whole text is in the surface files)."""


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 5] + " (...)"


def _shown(difference: Difference) -> str:
    old, new = difference.old, difference.new
    if old is None or new is None:
        return _cut(old or new or "")
    return _cut(f"{old} -> {new}")


def _draft_row(qualname: str, row: FunctionRow, value: tuple[str, str] | None) -> list[str]:
    indent = "            "
    if row.status == Status.MOVED and value is None:
        note = f"REVIEW: moved to {', '.join(row.moved_to)} (watched there? patched there?)"
    elif row.status == Status.MOVED:
        note = f"REVIEW: moved here from {row.module} ({row.qualname}): {row.detail()}"
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
