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
decisions: each posts its own to the process group's store and waits, at most ``timeout``
seconds (:data:`DEFAULT_TIMEOUT_S`), for every other rank of ``group`` to post theirs. Every
rank of ``group`` must call it. A rank that does not answer in time (it never calls the check,
or crashed, or hangs in start-up) is a :class:`RankCheckTimeout` naming the rank check, the
ranks that did not answer and the ranks that did, on every rank that waited, instead of a bare
``Timed out waiting ... for send operation`` from gloo after its 30-minute default. Where a
rank's fingerprint differs from the group's first rank's, the cells whose decisions differ are
named with both decisions and their provenance, and each rank's plugin set is listed.
Provenance (which plugin answered) is reported but not compared: two plugin sets that decide
the same are in agreement.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    "DEFAULT_TIMEOUT_S",
    "Cell",
    "RankCheckTimeout",
    "RankDisagreementError",
    "RankReport",
    "cell_of",
    "check_ranks_agree",
    "decisions",
    "fingerprint",
]

logger = logging.getLogger("warcore.ranks")

Cell = tuple[str, "ForwardMode | str", BoundaryContext]
"""(backend name, forward mode, context): one decision a rank makes."""

_SHOWN_CELLS = 20
"""At most this many differing cells are spelled out per rank in the error message."""


DEFAULT_TIMEOUT_S = 60.0
"""How long :func:`check_ranks_agree` waits for the other ranks' answers: long enough for
ranks that start a few seconds apart (each resolves its own matrix first, well under a
second), short enough that a rank that never joins is named within a minute."""

_POLL_S = 0.05


class RankCheckTimeout(TimeoutError):
    """Some ranks of the group did not answer the rank check within its timeout.

    ``missing``: the global ranks that did not answer; ``answered``: those that did (this one
    included)."""

    def __init__(self, message: str, missing: list[int], answered: list[int]) -> None:
        super().__init__(message)
        self.missing = missing
        self.answered = answered


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
    resolve_s: float = 0.0
    """This rank's time resolving its cells."""
    exchange_s: float = 0.0
    """This rank's time posting its answer and waiting for every other rank's."""

    @property
    def agree(self) -> bool:
        return not self.differing

    def differing_cells(self) -> set[str]:
        """Every cell (or fact) some rank decides differently from the reference rank."""
        return {key for keys in self.differing.values() for key in keys}


def _rows(pm: WarcorePluginManager, cells: Iterable[Cell] | None) -> list[MatrixRow]:
    if cells is None:
        return build_matrix(pm)
    cache = get_decision_cache(pm)
    facts = StepFacts()
    return [
        _row(pm, cache, backend, ForwardMode.parse(mode), context, facts)
        for backend, mode, context in cells
    ]


_KEY = re.compile(
    r"^backend '(?P<backend>[^']*)', mode (?P<mode>\w+), algorithm '(?P<algorithm>[^']*)'"
)


def cell_of(key: str) -> tuple[str, ForwardMode, str] | None:
    """(backend, mode, algorithm) of a cell key :func:`decisions` made; ``None`` for a fact."""
    found = _KEY.match(key)
    if found is None:
        return None
    return found["backend"], ForwardMode.parse(found["mode"]), found["algorithm"]


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
    timeout: float = DEFAULT_TIMEOUT_S,
    facts: Mapping[str, str] | None = None,
) -> RankReport:
    """Gather every rank's decisions over ``group`` (default: the world) and compare.

    Every rank of ``group`` must call it, with the same ``cells``, and the ranks must make
    their calls in the same order (each call is one round). Returns a :class:`RankReport`;
    when a rank differs from the group's first rank it logs an error naming the ranks, the
    differing cells (both decisions, with provenance) and each rank's plugins, and raises
    :class:`RankDisagreementError` unless ``raise_on_mismatch`` is false. Raises
    :class:`RankCheckTimeout` when a rank of ``group`` has not answered within ``timeout``
    seconds (default :data:`DEFAULT_TIMEOUT_S`). ``facts`` are compared like decisions, under
    their own keys: what an integration knows of the rank besides the cells (warcore-sglang:
    whether its activation is on). Needs ``torch.distributed`` initialised, with any backend:
    the answers travel through the process group's key-value store (the one
    ``init_process_group`` made: TCP or file), not through a collective.
    """
    import torch.distributed as dist

    if not timeout > 0:  # NaN too
        raise ValueError(
            f"check_ranks_agree: timeout must be a number of seconds > 0, got {timeout!r}"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "check_ranks_agree needs torch.distributed initialised (init_process_group)"
        )
    began = time.monotonic()
    pm = pm if pm is not None else get_plugin_manager()
    payload = _payload(pm, cells, dist.get_rank(), facts or {})
    world = dist.get_world_size(group)
    ranks = sorted(dist.get_process_group_ranks(group)) if group is not None else list(range(world))
    resolved = time.monotonic()
    gathered = _exchange(payload, dist.get_rank(), ranks, timeout)
    exchanged = time.monotonic()
    reference = gathered[0]
    differing = _differing(reference, gathered[1:])
    report = RankReport(
        world_size=world,
        reference_rank=reference["rank"],
        fingerprints={p["rank"]: p["fingerprint"] for p in gathered},
        plugins={p["rank"]: p["plugins"] for p in gathered},
        differing=differing,
        resolve_s=resolved - began,
        exchange_s=exchanged - resolved,
    )
    return _conclude(report, gathered, len(payload["decisions"]), raise_on_mismatch)


def _conclude(
    report: RankReport, gathered: list[dict[str, Any]], cells: int, raise_on_mismatch: bool
) -> RankReport:
    """Log the outcome (one line), and raise on a disagreement where asked to."""
    reference, differing = gathered[0], report.differing
    if report.agree:
        logger.info(
            "warcore: all %d ranks resolved the same read-done decisions (%d cells, %s)",
            report.world_size,
            cells,
            reference["fingerprint"][:12],
        )
        return report
    message = _message(reference, [p for p in gathered if p["rank"] in differing], differing)
    report = replace(report, message=message)
    logger.error("%s", message)
    if raise_on_mismatch:
        raise RankDisagreementError(message, report)
    return report


def _payload(
    pm: WarcorePluginManager,
    cells: Sequence[Cell] | None,
    rank: int,
    facts: Mapping[str, str],
) -> dict[str, Any]:
    """What this rank posts: its decisions (and ``facts``, compared as decisions are), their
    fingerprint and provenance, its plugins."""
    rows = _rows(pm, cells)
    table = {_key(row): _decision(row) for row in rows} | dict(facts)
    return {
        "rank": rank,
        "fingerprint": _digest(table),
        "decisions": table,
        "provenance": {_key(row): _provenance(row) for row in rows},
        "plugins": _plugin_list(pm),
    }


def _differing(reference: dict[str, Any], others: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Per rank whose fingerprint differs from the reference's: the cells that differ."""
    differing: dict[int, list[str]] = {}
    for other in others:
        if other["fingerprint"] == reference["fingerprint"]:
            continue
        keys = set(reference["decisions"]) | set(other["decisions"])
        differing[other["rank"]] = sorted(
            k for k in keys if reference["decisions"].get(k) != other["decisions"].get(k)
        )
    return differing


_ROUNDS: dict[tuple[int, ...], int] = {}
_ROUNDS_LOCK = threading.Lock()


def _exchange(
    payload: dict[str, Any], me: int, ranks: list[int], timeout: float
) -> list[dict[str, Any]]:
    """Every rank's ``payload``, in rank order, through the default group's store: post this
    one, then poll for the others until ``timeout``. One round per call on each rank, so the
    keys of two calls never mix. No rank leaves before every rank has read: the store lives
    in one rank's process (rank 0's TCP store), and a rank that raised and ended first would
    take it away from a rank still reading, which then could not say why. The round's keys
    stay in the store (a few kB per rank, once per check)."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()  # no public accessor; stable since torch 1.x
    with _ROUNDS_LOCK:
        round_ = _ROUNDS.get(tuple(ranks), 0)
        _ROUNDS[tuple(ranks)] = round_ + 1
    prefix = f"warcore/rank_check/{'-'.join(map(str, ranks))}/{round_}"
    deadline = time.monotonic() + timeout
    try:
        store.set(f"{prefix}/{me}", json.dumps(payload))
        _wait(store, prefix, me, ranks, timeout, deadline)
        gathered = [json.loads(store.get(f"{prefix}/{r}")) for r in ranks]
    except RankCheckTimeout:
        raise
    except Exception as exc:  # the store's process ended (rank 0's, usually)
        raise RuntimeError(
            f"warcore rank check (check_ranks_agree, on rank {me}): the process group's store "
            f"went away during the check ({type(exc).__name__}: {exc}): the rank holding it "
            "(rank 0 with a TCP store) ended first; its log says why"
        ) from None
    _confirm_read(store, f"{prefix}/read", len(ranks), deadline)
    return gathered


def _confirm_read(store: Any, key: str, ranks: int, deadline: float) -> None:
    """Say this rank has read every answer, and wait (within the deadline) until every rank
    has: the rank holding the store outlives the others' reads. The store going away now only
    means its holder saw every read and left: this rank has all it needs, so it goes on."""
    with contextlib.suppress(Exception):
        read = store.add(key, 1)
        while read < ranks and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            read = store.add(key, 0)


def _wait(
    store: Any, prefix: str, me: int, ranks: list[int], timeout: float, deadline: float
) -> None:
    """Until every rank of ``ranks`` posted its answer, or :class:`RankCheckTimeout`."""
    missing = [r for r in ranks if r != me]
    while True:
        missing = [r for r in missing if not store.check([f"{prefix}/{r}"])]
        if not missing:
            return
        if time.monotonic() >= deadline:
            answered = [r for r in ranks if r not in missing]
            raise RankCheckTimeout(
                _timeout_message(me, ranks, missing, answered, timeout), missing, answered
            )
        time.sleep(_POLL_S)


def _timeout_message(
    me: int, ranks: list[int], missing: list[int], answered: list[int], timeout: float
) -> str:
    def listed(rs: list[int]) -> str:
        return ", ".join(map(str, rs)) or "none"

    return (
        f"warcore rank check (check_ranks_agree, on rank {me}): rank(s) {listed(missing)} did "
        f"not answer within {timeout:g} s; rank(s) {listed(answered)} did (group of "
        f"{len(ranks)}: {listed(ranks)}). Every rank must call check_ranks_agree, in the same "
        "order; a rank that starts later needs a longer timeout"
    )


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
