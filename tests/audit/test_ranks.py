"""warcore.audit.ranks: every rank resolves the same decisions, checked over torch.distributed.

Two real processes (``torch.multiprocessing.spawn``) join a ``gloo`` group on the CPU through a
file store; each builds its own plugin manager. Where rank 1 registers one more plugin, whose
declaration changes a decision, the check names rank 1 and exactly the cells that differ;
where both hold the same plugins it passes, and ranks whose plugin sets differ but decide alike
agree too (provenance is reported, not compared).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as tmp_mp

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary
from warcore.audit.ranks import (
    DEFAULT_TIMEOUT_S,
    RankCheckTimeout,
    RankDisagreementError,
    cell_of,
    check_ranks_agree,
    decisions,
    fingerprint,
)
from warcore.core import WarcorePluginManager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

CELLS = [
    ("torch_native", ForwardMode.DECODE, BoundaryContext("none")),
    ("torch_native", ForwardMode.TARGET_VERIFY, BoundaryContext("eagle")),
    ("torch_native", ForwardMode.EXTEND, BoundaryContext("none")),
    ("hybrid", ForwardMode.DECODE, BoundaryContext("none")),
]


class LaterDecode:
    """A plugin that claims torch_native's captured decode ends only after the replay."""

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext
    ) -> SharedReadBoundary | None:
        if backend == "torch_native" and forward_mode is ForwardMode.DECODE:
            return SharedReadBoundary.POST_REPLAY
        return None


class SameAnswer:
    """A plugin that declares exactly what the core already says (same decisions)."""

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext
    ) -> SharedReadBoundary | None:
        if backend == "torch_native" and forward_mode is ForwardMode.DECODE:
            return SharedReadBoundary.IN_REPLAY
        return None


def _worker(rank: int, store: str, out: str, extra: str, cells: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        pm = WarcorePluginManager()  # builtins only: the test controls the plugin set
        if rank == 1 and extra in ("later", "same"):
            pm.register({"later": LaterDecode(), "same": SameAnswer()}[extra], name="wctest_extra")
        facts = {"integration": f"off on rank {rank}" if extra == "fact" else "on"}
        chosen = CELLS if cells == "few" else None
        try:
            report = check_ranks_agree(cells=chosen, pm=pm, facts=facts)
            result: dict[str, Any] = {"agree": report.agree, "fingerprints": report.fingerprints}
        except RankDisagreementError as exc:
            result = {
                "error": str(exc),
                "differing": exc.report.differing,
                "cells": sorted(exc.report.differing_cells()),
                "reference": exc.report.reference_rank,
            }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result, default=str))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, extra: str, cells: str = "few") -> list[dict[str, Any]]:
    store = tmp_path / "store"
    tmp_mp.spawn(_worker, args=(str(store), str(tmp_path), extra, cells), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_an_extra_plugin_on_rank_1_is_named_with_the_cells_it_changes(tmp_path: Path) -> None:
    results = _run(tmp_path, "later")
    for result in results:  # every rank raises, with the same report
        assert "error" in result, result
        assert result["reference"] == 0
        assert list(result["differing"]) == ["1"]
        # torch_native's decode, and the hybrid wrapper's, whose decode child it is.
        assert result["differing"]["1"] == [
            "backend 'hybrid', mode DECODE, algorithm 'none'",
            "backend 'torch_native', mode DECODE, algorithm 'none'",
        ]
        message = result["error"]
        assert "rank(s) 1 differ from rank 0" in message
        assert "boundary=IN_REPLAY record=in_graph_node" in message  # rank 0
        assert "boundary=POST_REPLAY record=post_replay" in message  # rank 1
        assert "plugin:wctest_extra" in message  # rank 1's provenance names the plugin
        assert "plugins on rank 1:" in message and "wctest_extra=" in message


def test_a_fact_that_differs_is_named_like_a_cell(tmp_path: Path) -> None:
    results = _run(tmp_path, "fact")
    for result in results:
        assert result["cells"] == ["integration"], result
        assert "integration: rank 0 off on rank 0 [-]; rank 1 off on rank 1 [-]" in result["error"]
    assert cell_of("integration") is None
    assert cell_of("backend 'hybrid', mode DECODE, algorithm 'none'") == (
        "hybrid",
        ForwardMode.DECODE,
        "none",
    )


def test_equal_plugin_sets_pass(tmp_path: Path) -> None:
    results = _run(tmp_path, "")
    assert all(r.get("agree") for r in results), results
    assert len({tuple(sorted(r["fingerprints"].values())) for r in results}) == 1


def test_equal_plugin_sets_pass_over_the_whole_matrix(tmp_path: Path) -> None:
    results = _run(tmp_path, "", cells="all")
    assert all(r.get("agree") for r in results), results


def test_a_different_plugin_that_decides_alike_agrees(tmp_path: Path) -> None:
    results = _run(tmp_path, "same")
    assert all(r.get("agree") for r in results), results


def test_fingerprint_follows_decisions_not_provenance() -> None:
    plain = WarcorePluginManager()
    same = WarcorePluginManager()
    same.register(SameAnswer(), name="wctest_same")
    later = WarcorePluginManager()
    later.register(LaterDecode(), name="wctest_later")
    assert fingerprint(plain, CELLS) == fingerprint(same, CELLS)
    assert fingerprint(plain, CELLS) != fingerprint(later, CELLS)
    table = decisions(later, CELLS)
    assert table["backend 'torch_native', mode DECODE, algorithm 'none'"].startswith(
        "boundary=POST_REPLAY record=post_replay"
    )


def test_needs_an_initialised_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # pragma: no cover - not in this suite
        pytest.skip("a process group is already initialised")
    with pytest.raises(RuntimeError, match="init_process_group"):
        check_ranks_agree(cells=CELLS, pm=WarcorePluginManager())


# -- a rank that never joins the check ------------------------------------------------------


def _absent_worker(rank: int, store: str, out: str, world: int, timeout: float) -> None:
    """Every rank but the last calls the check; the last joins the process group and then
    never calls it (it waits for the others' results, then leaves)."""
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        if rank == world - 1:
            deadline = time.monotonic() + 120
            others = [Path(out, f"rank{r}.json") for r in range(world - 1)]
            while not all(p.exists() for p in others) and time.monotonic() < deadline:
                time.sleep(0.1)
            return
        start = time.monotonic()
        try:
            check_ranks_agree(cells=CELLS, pm=WarcorePluginManager(), timeout=timeout)
            result: dict[str, Any] = {"agree": True}
        except RankCheckTimeout as exc:
            result = {"error": str(exc), "missing": exc.missing, "answered": exc.answered}
        result["elapsed"] = time.monotonic() - start
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_a_rank_that_never_joins_is_named_within_the_timeout(tmp_path: Path) -> None:
    store, world, timeout = tmp_path / "store", 3, 2.0
    tmp_mp.spawn(
        _absent_worker, args=(str(store), str(tmp_path), world, timeout), nprocs=world, join=True
    )
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" in result, result  # was: a wait of gloo's 30 minutes, then a bare error
        assert (result["missing"], result["answered"]) == ([2], [0, 1])
        message = result["error"]
        assert message.startswith(f"warcore rank check (check_ranks_agree, on rank {rank}):")
        assert "rank(s) 2 did not answer within 2 s; rank(s) 0, 1 did" in message
        assert timeout <= result["elapsed"] < timeout + 10


def test_the_default_timeout_is_short_and_a_bad_one_is_refused() -> None:
    assert 0 < DEFAULT_TIMEOUT_S <= 120
    import inspect

    assert inspect.signature(check_ranks_agree).parameters["timeout"].default == DEFAULT_TIMEOUT_S
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
            check_ranks_agree(cells=CELLS, pm=WarcorePluginManager(), timeout=bad)
