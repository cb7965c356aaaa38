"""Which entry points load: the allowlist, the block list, the reserved name, duplicate names.

A pure function of the entry points' names and the two lists, so the policy is tested on plain
data; the manager (:meth:`~warcore.core.WarcorePluginManager.load_entry_points`) does what it
says, one entry point at a time.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from ._config import ENV_DISABLE_PLUGINS, ENV_PLUGINS

__all__ = ["BUILTIN_PLUGIN_NAME", "Candidate", "Selection", "Verdict", "select_entry_points"]

BUILTIN_PLUGIN_NAME = "warcore"
"""The core's own plugin's name (the built-in backends, algorithms and vetoes); no entry point
may take it."""


@dataclass(frozen=True)
class Candidate:
    """An installed entry point, as selection sees it: its name and its distribution's."""

    name: str
    distribution: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What becomes of ``candidates[index]``: ``load`` it, or list it ``disabled`` or
    ``failed``, saying why."""

    index: int
    action: Literal["load", "disabled", "failed"]
    reason: str | None = None


@dataclass(frozen=True)
class Selection:
    verdicts: tuple[Verdict, ...]
    """One per candidate, in the order the loader acts on them: first those the lists or the
    reserved name refuse, then the admitted ones (each loaded, or failed as a duplicate name),
    each group sorted by (entry-point name, distribution)."""
    unknown: tuple[str, ...] = ()
    """Allowlist entries that name no candidate."""
    problems: tuple[str, ...] = ()
    """Allowlist entries that several distributions answer to (none of them is admitted)."""


def _canonical(name: str) -> str:
    """PEP 503 normalisation, so ``warcore_dflash`` matches ``warcore-dflash``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def select_entry_points(
    candidates: Sequence[Candidate],
    allowlist: Collection[str] | None,
    blocked: Collection[str] = (),
) -> Selection:
    """Decide, for each entry point, whether it loads.

    An entry of the allowlist (``None``: every entry point) or of ``blocked`` is ``DIST:EP``
    (exactly that distribution's entry point) or a bare ``NAME``, which stands for every entry
    point whose distribution is ``NAME`` or whose entry-point name is ``NAME``, provided those
    all belong to one distribution. A bare name that two distributions answer to is ambiguous:
    it admits none of them (a problem) and blocks all of them. Names compare after PEP 503
    normalisation (case, and ``-``, ``_``, ``.`` alike). The lists are applied first; then an
    entry-point name that more than one admitted distribution offers loads from none of them
    (each fails, naming the others), so a distribution that is not admitted never takes an
    admitted one's place; and no entry point may be named ``warcore``.
    """
    order = sorted(
        range(len(candidates)),
        key=lambda k: (candidates[k].name, candidates[k].distribution or ""),
    )
    ids = {
        k: (_canonical(c.distribution or ""), _canonical(c.name)) for k, c in enumerate(candidates)
    }
    admitted, ambiguous, unknown, problems = _allowed(allowlist, ids)
    refused = set().union(*(_matches(entry, ids)[0] for entry in blocked))
    verdicts: list[Verdict] = []
    usable: list[int] = []
    for k in order:
        why = _refusal(candidates[k], k in refused, admitted, ambiguous.get(k), k)
        if why is None:
            usable.append(k)
        else:
            verdicts.append(why)
    verdicts += _duplicates(candidates, usable)
    return Selection(tuple(verdicts), unknown, problems)


def _refusal(
    candidate: Candidate,
    blocked: bool,
    admitted: set[int] | None,
    ambiguous_entry: str | None,
    k: int,
) -> Verdict | None:
    if admitted is not None and k not in admitted:
        why = (
            f"{ENV_PLUGINS} entry {ambiguous_entry!r} is ambiguous"
            if ambiguous_entry is not None
            else f"not listed in {ENV_PLUGINS}"
        )
        return Verdict(k, "disabled", why)
    if blocked:
        return Verdict(k, "disabled", f"blocked by {ENV_DISABLE_PLUGINS}")
    if candidate.name == BUILTIN_PLUGIN_NAME:
        why = f"entry-point name {candidate.name!r} is the core's own plugin name; not loaded"
        return Verdict(k, "failed", why)
    return None


def _duplicates(candidates: Sequence[Candidate], usable: list[int]) -> list[Verdict]:
    """The admitted ones: an entry-point name that several distributions offer loads from
    none of them."""
    by_name: dict[str, list[int]] = {}
    for k in usable:
        by_name.setdefault(candidates[k].name, []).append(k)
    verdicts = []
    for k in usable:
        twins = by_name[candidates[k].name]
        if len(twins) == 1:
            verdicts.append(Verdict(k, "load"))
            continue
        who = " and ".join(repr(candidates[t].distribution) for t in twins)
        why = (
            f"duplicate entry point name {candidates[k].name!r}: distributions {who}; none of "
            f"them is loaded (choose one with {ENV_PLUGINS}=DISTRIBUTION:ENTRY_POINT, or "
            f"block the others with {ENV_DISABLE_PLUGINS})"
        )
        verdicts.append(Verdict(k, "failed", why))
    return verdicts


def _allowed(
    allowlist: Collection[str] | None, ids: dict[int, tuple[str, str]]
) -> tuple[set[int] | None, dict[int, str], tuple[str, ...], tuple[str, ...]]:
    """The candidates the allowlist admits (``None``: all), those an ambiguous entry names
    (with the entry), the entries that name nobody and the ambiguity problems."""
    if allowlist is None:
        return None, {}, (), ()
    admitted: set[int] = set()
    ambiguous: dict[int, str] = {}
    unknown, problems = [], []
    for entry in sorted(allowlist):
        matches, dists = _matches(entry, ids)
        if not matches:
            unknown.append(entry)
        elif len(dists) > 1:
            owners = ", ".join(sorted(repr(d or "?") for d in dists))
            problems.append(
                f"{ENV_PLUGINS} names {entry!r}, which plugins of several distributions "
                f"answer to ({owners}): none of them is loaded; name one as "
                "DISTRIBUTION:ENTRY_POINT or by its distribution name"
            )
            for k in matches:
                ambiguous.setdefault(k, entry)
        else:
            admitted |= matches
    return admitted, ambiguous, tuple(unknown), tuple(problems)


def _matches(entry: str, ids: dict[int, tuple[str, str]]) -> tuple[set[int], set[str]]:
    """The candidates (keys of ``ids``: canonical (distribution, entry point) pairs) a list
    entry names, and their distributions."""
    if ":" in entry:
        dist, _, name = entry.partition(":")
        want = (_canonical(dist), _canonical(name))
        found = {k for k, pair in ids.items() if pair == want}
    else:
        key = _canonical(entry)
        found = {k for k, (dist, name) in ids.items() if key in (dist, name)}
    return found, {ids[k][0] for k in found}
