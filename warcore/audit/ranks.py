"""Every rank agrees: compare each rank's resolved read-done decisions over ``torch.distributed``.

A multi-rank server (one process per tensor- or pipeline-parallel rank) resolves its decisions
in every process on its own. A node with a different plugin set, a different plugin version or
a different environment (``WARCORE_FORCE_COARSE``, an allowlist) decides differently without a
word: one rank publishes its read-done event before the replay, another after it. This module
turns that into a start-up error naming the ranks and the cells::

    import torch.distributed as dist
    from warcore.audit.ranks import check_ranks_agree

    dist.init_process_group("gloo", ...)        # or the engine's CPU group
    check_ranks_agree()                         # raises RankDisagreementError if ranks differ

Each rank resolves the same cells (by default every cell of ``warcore matrix``: registered
backend × mode × algorithm of the backend's engine), turns each decision into a short text (the
boundary, the record points, the publish phase, whether a veto applies, the event owner) and
hashes them all (:func:`fingerprint`). Every rank then gathers every rank's fingerprint and
decisions (``all_gather_object``, one collective: every rank of ``group`` must call it). Where
a rank's fingerprint differs from the group's first rank's, the cells whose decisions differ
are named with both decisions and their provenance, and each rank's plugin set is listed.
Provenance (which plugin answered) is reported but not compared: two plugin sets that decide
the same are in agreement.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from warcore.audit.matrix import MatrixRow, _row, build_matrix
from warcore.core import (
    BoundaryContext,
    ForwardMode,
    StepFacts,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
)

__all__ = [
    "Cell",
    "RankDisagreementError",
    "RankReport",
    "check_ranks_agree",
    "decisions",
    "fingerprint",
]

logger = logging.getLogger("warcore.ranks")

Cell = tuple[str, "ForwardMode | str", BoundaryContext]
"""(backend name, forward mode, context): one decision a rank makes."""

_SHOWN_CELLS = 20
"""At most this many differing cells are spelled out per rank in the error message."""


class RankDisagreementError(RuntimeError):
    """Ranks resolved different read-done decisions; the message names the ranks and cells."""

    def __init__(self, message: str, report: RankReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class RankReport:
    """What :func:`check_ranks_agree` found. ``differing`` maps a global rank to the cells
    (keys of :func:`decisions`) where it decides differently from ``reference_rank``."""

    world_size: int
    reference_rank: int
    fingerprints: dict[int, str]
    plugins: dict[int, list[str]]
    differing: dict[int, list[str]] = field(default_factory=dict)
    message: str = ""

    @property
    def agree(self) -> bool:
        return not self.differing


def _rows(pm: WarcorePluginManager, cells: Iterable[Cell] | None) -> list[MatrixRow]:
    if cells is None:
        return build_matrix(pm)
    cache = get_decision_cache(pm)
    facts = StepFacts()
    return [
        _row(pm, cache, backend, ForwardMode.parse(mode), context, facts)
        for backend, mode, context in cells
    ]


def _key(row: MatrixRow) -> str:
    flags = ",".join(f"{k}={v}" for k, v in row.declared.context.flags)
    return f"backend {row.backend!r}, mode {row.mode.name}, algorithm {row.algorithm!r}" + (
        f", flags {flags}" if flags else ""
    )


def _decision(row: MatrixRow) -> str:
    vetoed = row.veto is not None and row.veto.vetoed
    owner = None if row.owner is None else row.owner.owner
    return (
        f"boundary={row.declared.boundary.name} record={row.record_point.value} "
        f"eager={row.eager_point.value} publish={row.publish.publishes} vetoed={vetoed} "
        f"per_batch={row.per_batch} owner={owner}"
    )


def _provenance(row: MatrixRow) -> str:
    return f"{row.declared.source}; {row.source}"


def decisions(
    pm: WarcorePluginManager | None = None, cells: Iterable[Cell] | None = None
) -> dict[str, str]:
    """Each cell's decision as text, keyed by the cell (``backend 'x', mode M, algorithm 'a'``);
    ``cells`` default to every cell of ``warcore matrix`` (no flags)."""
    pm = pm if pm is not None else get_plugin_manager()
    return {_key(row): _decision(row) for row in _rows(pm, cells)}


def _digest(table: dict[str, str]) -> str:
    h = hashlib.sha256()
    for key in sorted(table):
        h.update(key.encode())
        h.update(b"\0")
        h.update(table[key].encode())
        h.update(b"\n")
    return h.hexdigest()


def fingerprint(pm: WarcorePluginManager | None = None, cells: Iterable[Cell] | None = None) -> str:
    """A sha256 over the decisions of ``cells`` (see :func:`decisions`): equal on two ranks
    exactly when they decide every cell alike, whoever answered."""
    return _digest(decisions(pm, cells))


def _plugin_list(pm: WarcorePluginManager) -> list[str]:
    return [
        f"{i.name}={i.distribution or '-'} {i.version or '-'} ({i.status})" for i in pm.plugin_infos
    ]


def check_ranks_agree(
    group: Any = None,
    cells: Sequence[Cell] | None = None,
    *,
    pm: WarcorePluginManager | None = None,
    raise_on_mismatch: bool = True,
) -> RankReport:
    """All-gather every rank's decisions over ``group`` (default: the world) and compare.

    Collective: every rank of ``group`` must call it, with the same ``cells``. Returns a
    :class:`RankReport`; when a rank differs from the group's first rank it logs an error
    naming the ranks, the differing cells (both decisions, with provenance) and each rank's
    plugins, and raises :class:`RankDisagreementError` unless ``raise_on_mismatch`` is false.
    Needs ``torch.distributed`` initialised (any backend that supports
    ``all_gather_object``: gloo, or NCCL with the current CUDA device set).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "check_ranks_agree needs torch.distributed initialised (init_process_group)"
        )
    pm = pm if pm is not None else get_plugin_manager()
    rows = _rows(pm, cells)
    table = {_key(row): _decision(row) for row in rows}
    payload = {
        "rank": dist.get_rank(),
        "fingerprint": _digest(table),
        "decisions": table,
        "provenance": {_key(row): _provenance(row) for row in rows},
        "plugins": _plugin_list(pm),
    }
    world = dist.get_world_size(group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, payload, group=group)
    reference = gathered[0]
    differing: dict[int, list[str]] = {}
    for other in gathered[1:]:
        if other["fingerprint"] == reference["fingerprint"]:
            continue
        keys = set(reference["decisions"]) | set(other["decisions"])
        differing[other["rank"]] = sorted(
            k for k in keys if reference["decisions"].get(k) != other["decisions"].get(k)
        )
    report = RankReport(
        world_size=world,
        reference_rank=reference["rank"],
        fingerprints={p["rank"]: p["fingerprint"] for p in gathered},
        plugins={p["rank"]: p["plugins"] for p in gathered},
        differing=differing,
    )
    if report.agree:
        logger.info(
            "warcore: all %d ranks resolved the same read-done decisions (%d cells, %s)",
            world,
            len(table),
            reference["fingerprint"][:12],
        )
        return report
    message = _message(reference, [p for p in gathered if p["rank"] in differing], differing)
    report = RankReport(
        report.world_size,
        report.reference_rank,
        report.fingerprints,
        report.plugins,
        report.differing,
        message,
    )
    logger.error("%s", message)
    if raise_on_mismatch:
        raise RankDisagreementError(message, report)
    return report


def _message(
    reference: dict[str, Any], others: list[dict[str, Any]], differing: dict[int, list[str]]
) -> str:
    ref = reference["rank"]
    ranks = ", ".join(str(r) for r in sorted(differing))
    lines = [
        f"warcore: ranks disagree on read-done decisions: rank(s) {ranks} differ from rank "
        f"{ref} (a different plugin set, plugin version or environment decides differently)"
    ]
    for other in others:
        rank = other["rank"]
        cells = differing[rank]
        lines.append(f"rank {rank}: {len(cells)} cell(s) differ from rank {ref}:")
        for key in cells[:_SHOWN_CELLS]:
            mine = other["decisions"].get(key, "(not resolved)")
            theirs = reference["decisions"].get(key, "(not resolved)")
            lines.append(
                f"  {key}: rank {ref} {theirs} [{reference['provenance'].get(key, '-')}]; "
                f"rank {rank} {mine} [{other['provenance'].get(key, '-')}]"
            )
        if len(cells) > _SHOWN_CELLS:
            lines.append(f"  ... and {len(cells) - _SHOWN_CELLS} more")
    for payload in (reference, *others):
        lines.append(f"plugins on rank {payload['rank']}: {'; '.join(payload['plugins'])}")
    return "\n".join(lines)
