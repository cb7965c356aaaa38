"""Ranks compared at run time: each rank's barriers, batch by batch, from their traces.

The rank check compares what every rank *would* decide, once, at start-up. A trace says what
each rank *did* on every batch: the tensor-parallel ranks of one pipeline stage and one data
parallel group run the same batches in the same order, so their ``n``-th barriers are the same
batch, and each must have taken the same record point and the same barrier branch. The traces
may be one file all ranks appended to, or one per node (:func:`compare_ranks` takes records
from several files; a scheduler is known by its file and pid).

:func:`compare_ranks` returns the groups it compared and every divergence, named by batch,
ranks and both decisions; ``python -m warcore_sglang.audit.trace FILE...`` prints them and exits 1
on a divergence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Divergence", "Group", "RankComparison", "TwoRuns", "compare_ranks"]

DECISION = ("mode", "record_point", "branch", "owner")
"""What each rank's barrier must agree on, for the same batch."""


@dataclass
class Group:
    """The schedulers of one pipeline stage and data-parallel group (they differ in tp)."""

    pp: Any
    dp: Any
    barriers: dict[str, int] = field(default_factory=dict)
    """Rank label (``tp 0``, with its file where there are several) -> barriers."""
    modes: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Divergence:
    batch: int
    """The batch's place in each rank's sequence of barriers (1: the first)."""
    ranks: tuple[str, str]
    decisions: tuple[str, str]
    rids: tuple[str, ...] = ()

    def line(self) -> str:
        (a, b), (x, y) = self.ranks, self.decisions
        rids = f" (requests {', '.join(self.rids[:4])})" if self.rids else ""
        return f"batch {self.batch}{rids}: {a} {x}; {b} {y}"


@dataclass
class RankComparison:
    groups: list[Group]
    divergences: list[Divergence]

    @property
    def agree(self) -> bool:
        return not self.divergences

    def lines(self) -> list[str]:
        out = []
        for g in self.groups:
            counts = ", ".join(f"{rank} {n}" for rank, n in g.barriers.items())
            modes = ", ".join(f"{m} {n}" for m, n in sorted(g.modes.items()))
            out.append(f"  pp {g.pp}, dp {g.dp}: barriers per rank: {counts} ({modes})")
        if self.agree:
            out.append("  every rank took the same record point and barrier on every batch")
        else:
            out.append(f"  DIVERGENCE: {len(self.divergences)} batch(es) decided differently")
            out += [f"    {d.line()}" for d in self.divergences[:20]]
        return out


def _decision(record: dict[str, Any]) -> str:
    return " ".join(f"{k}={record.get(k)}" for k in DECISION)


def _label(file: int, rank: dict[str, Any], files: int) -> str:
    where = f" (file {file + 1})" if files > 1 else ""
    return f"tp {rank.get('tp')}{where}"


class TwoRuns(ValueError):
    """Two schedulers of the same rank in one trace file: two server runs appended to it."""


def _schedulers(
    traces: list[list[dict[str, Any]]], paths: Sequence[str] | None
) -> dict[tuple[int, int], list[Any]]:
    """(file, pid) -> that scheduler's barrier records, in order; :class:`TwoRuns` where a
    file holds two schedulers of one rank (their batches are no one's to compare)."""
    out: dict[tuple[int, int], list[Any]] = {}
    for index, records in enumerate(traces):
        for r in records:
            if r.get("kind") == "barrier":
                out.setdefault((index, int(r["pid"])), []).append(r)
    seen: dict[tuple[int, str], int] = {}
    for (index, pid), barriers in sorted(out.items()):
        rank = barriers[0].get("rank") or {}
        key = (index, ", ".join(f"{k} {rank.get(k)}" for k in ("tp", "pp", "dp")))
        if key in seen:
            file = paths[index] if paths is not None else f"file {index + 1}"
            raise TwoRuns(
                f"{file}: two schedulers of rank {key[1]} (pids {seen[key]} and {pid}): one "
                "trace file holds one server run (was a server restarted onto it?); give "
                "each run its own WARCORE_SGLANG_TRACE file"
            )
        seen[key] = pid
    return out


def compare_ranks(
    traces: list[list[dict[str, Any]]], paths: Sequence[str] | None = None
) -> RankComparison:
    """Compare, batch by batch, the schedulers of each (pp, dp) group in ``traces`` (the
    records of each trace file, read from ``paths``, which name them in an error)."""
    grouped: dict[tuple[Any, Any], list[tuple[str, list[Any]]]] = {}
    for (file, _), barriers in sorted(_schedulers(traces, paths).items()):
        rank = barriers[0].get("rank") or {}
        label = _label(file, rank, len(traces))
        grouped.setdefault((rank.get("pp"), rank.get("dp")), []).append((label, barriers))
    groups, divergences = [], []
    for (pp, dp), members in sorted(grouped.items(), key=lambda kv: str(kv[0])):
        members.sort(key=lambda m: m[0])
        group = Group(pp, dp, {label: len(b) for label, b in members})
        group.modes = Counter(str(r.get("mode")) for r in members[0][1])
        groups.append(group)
        divergences += _diverging(members)
    return RankComparison(groups, divergences)


def _diverging(members: list[tuple[str, list[Any]]]) -> list[Divergence]:
    (first, reference), out = members[0], []
    for label, barriers in members[1:]:
        for n, (a, b) in enumerate(zip(reference, barriers, strict=False), 1):
            if _decision(a) != _decision(b):
                rids = tuple(str(r) for r in a.get("rids") or ())
                out.append(Divergence(n, (first, label), (_decision(a), _decision(b)), rids))
        if len(barriers) != len(reference):
            n = min(len(barriers), len(reference)) + 1
            counts = (f"{len(reference)} barriers", f"{len(barriers)} barriers")
            out.append(Divergence(n, (first, label), counts))
    return out
