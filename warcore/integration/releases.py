"""An engine's audited releases, as data, and the gate that picks the one installed.

An integration follows a moving engine: each release it has audited is one :class:`Release`
entry (a subclass adds what that engine's declarations need), kept in one module of plain data
per engine, and one code path reads them. A release is admitted exactly: its version string
equal to an entry's (``0.5.23.post1``, ``0.5.23.1`` and a local build ``0.5.23+g1234abc`` are
other code), and then only if the code it relies on is what was audited (the engine-code
checks, where each watched module is imported). Adding a release is an entry, usually
:meth:`Release.derive`-d from the nearest one with what differs, and its evidence.

An engine integration describes itself to warcore's tools with an :class:`Engine` under the
entry-point group :data:`ENGINES` (``warcore release`` reads it).

Standard library only.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import importlib.util
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .checks import Check
from .surface import Spec

__all__ = [
    "ENGINES",
    "Engine",
    "Functions",
    "Release",
    "UnsupportedRelease",
    "by_version",
    "release_in_force",
    "load_engines",
    "pick",
]

logger = logging.getLogger(__name__)

ENGINES = "warcore.integrations"
"""The entry-point group an engine integration registers its :class:`Engine` under."""

Functions = Mapping[str, Mapping[str, tuple[str, str]]]
"""module -> qualified name -> (signature, digest): the engine functions a release's
declarations and patches rely on (a digest ``""`` checks the signature only)."""

R = TypeVar("R", bound="Release")


class UnsupportedRelease(RuntimeError):
    """The installed engine is not a release the integration audited (or is not installed)."""


@dataclass(frozen=True)
class Release:
    """One audited engine release: what the integration relies on in it, as data."""

    version: str
    functions: Functions
    """Every engine function relied on, with its audited signature and digest."""
    watched: Mapping[str, str]
    """module -> the name of its check-and-patch step (the integration's own table of steps):
    every module checked where it is imported, patched only once it passed."""
    checks: Mapping[str, tuple[Check, ...]] = field(default_factory=dict)
    """module -> structural checks beyond the functions' digests (members, globals, who
    assigns an attribute), run with the module's functions before it is patched."""
    evidence: str = ""
    """Where these facts were read: the wheel, and what was run against it."""

    def derive(
        self: R,
        version: str,
        *,
        functions: Mapping[str, Mapping[str, tuple[str, str] | None]] | None = None,
        **changes: Any,
    ) -> R:
        """This release's entry for ``version``, with ``functions`` rows changed (a row
        ``None`` is a function that release does not have) and any other field replaced."""
        table = {module: dict(rows) for module, rows in self.functions.items()}
        for module, rows in (functions or {}).items():
            table.setdefault(module, {})
            for qualname, row in rows.items():
                if row is None:
                    table[module].pop(qualname, None)
                else:
                    table[module][qualname] = row
        kept = {module: rows for module, rows in table.items() if rows}
        return dataclasses.replace(self, version=version, functions=kept, **changes)

    def functions_of(self, module: str) -> Mapping[str, tuple[str, str]]:
        return self.functions.get(module, {})


def by_version(releases: Iterable[R]) -> dict[str, R]:
    """``{version: release}``; a version given twice is an error naming it."""
    table: dict[str, R] = {}
    for release in releases:
        if release.version in table:
            raise ValueError(f"release {release.version} is listed twice")
        table[release.version] = release
    return table


def pick(engine: str, installed: str | None, releases: Mapping[str, R], described: str = "") -> R:
    """The audited entry for the installed version, compared as a string, exactly; else
    :class:`UnsupportedRelease` in one sentence naming the installed release (``described``,
    default ``<engine> <version>``) and the audited ones."""
    if installed is None:
        raise UnsupportedRelease(f"{engine} is not installed")
    release = releases.get(installed)
    if release is None:
        raise UnsupportedRelease(
            f"{described or f'{engine} {installed}'} is not a release "
            f"warcore-{engine.lower()} has audited (audited: {', '.join(releases)}, exactly)"
        )
    return release


@dataclass(frozen=True)
class Engine:
    """An engine integration, as warcore's tools see it (``warcore release``)."""

    name: str
    """``sglang``, ``vllm``: what a user types."""
    distribution: str
    """The engine's distribution on the package index (``pip download <distribution>==V``)."""
    releases: Mapping[str, Release]
    data_module: str
    """The module holding :attr:`releases` (where a new entry goes)."""
    surface: Spec = ()
    """What the engine's WAR surface is (:mod:`warcore.integration.surface`): its extractors,
    each one section; none, no surface compared."""
    surfaces: Path | None = None
    """The folder holding each audited release's surface, ``<version>.json`` (reviewed,
    committed; written by ``warcore release ENGINE WHEEL --write-surface``); default:
    ``surfaces`` beside :attr:`data_module`'s file."""

    def surface_file(self, version: str) -> Path | None:
        folder = self.surfaces
        if folder is None:
            found = importlib.util.find_spec(self.data_module)
            origin = found.origin if found is not None else None
            folder = Path(origin).resolve().with_name("surfaces") if origin else None
        return folder / f"{version}.json" if folder is not None else None


def _shown(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose str raises is still named
        return type(exc).__name__


def load_engines() -> tuple[dict[str, Engine], dict[str, str]]:
    """Every engine integration registered under :data:`ENGINES`, by :attr:`Engine.name`, and
    those that failed to load: entry point name -> why, in one line (its import raised, or
    it is not an :class:`Engine`, or it takes the name of another; the same object registered
    twice is one engine). Each entry point is
    tried on its own, so one broken plugin takes only itself out; each failure is logged as
    an error naming it, with its traceback at debug level (``warcore -v``)."""
    engines: dict[str, Engine] = {}
    failed: dict[str, str] = {}
    for entry in metadata.entry_points(group=ENGINES):
        try:
            engine = entry.load()
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() is its own failure
            failed[entry.name] = f"{entry.value}: {_shown(exc)}"
            logger.error(
                "engine integration %r failed to load: %s",
                entry.name,
                failed[entry.name],
                exc_info=logger.isEnabledFor(logging.DEBUG),
            )
            continue
        if not isinstance(engine, Engine):
            failed[entry.name] = f"{entry.value} is a {type(engine).__name__}, not an Engine"
        elif engines.get(engine.name) is engine:
            continue  # registered twice (a checkout's data beside an install): one engine
        elif engine.name in engines:
            failed[entry.name] = f"{entry.value} names engine {engine.name!r}, taken already"
        else:
            engines[engine.name] = engine
            continue
        logger.error("engine integration %r failed to load: %s", entry.name, failed[entry.name])
    return engines, failed


def release_in_force(engine: Engine) -> str:
    """One line: which release of ``engine`` is installed, and whether it is audited (its
    entry is then the one in force), from the installed metadata alone (nothing imported)."""
    try:
        installed: str | None = metadata.version(engine.distribution)
    except metadata.PackageNotFoundError:
        installed = None
    if installed is None:
        return f"engine: {engine.name} is not installed"
    if installed in engine.releases:
        return f"engine: {engine.name} {installed} installed: audited, its entry in force"
    return (
        f"engine: {engine.name} {installed} installed: not an audited release (audited: "
        f"{', '.join(engine.releases)}): the engine's own decisions apply"
    )
