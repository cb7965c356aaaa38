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
from warcore.audit.ranks import RankDisagreementError, check_ranks_agree, decisions, fingerprint
from warcore.core import WarcorePluginManager

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
        if rank == 1 and extra:
            pm.register({"later": LaterDecode(), "same": SameAnswer()}[extra], name="extra")
        chosen = CELLS if cells == "few" else None
        try:
            report = check_ranks_agree(cells=chosen, pm=pm)
            result: dict[str, Any] = {"agree": report.agree, "fingerprints": report.fingerprints}
        except RankDisagreementError as exc:
            result = {
                "error": str(exc),
                "differing": exc.report.differing,
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
        assert "plugin:extra" in message  # rank 1's provenance names the plugin
        assert "plugins on rank 1:" in message and "extra=" in message


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
    same.register(SameAnswer(), name="same")
    later = WarcorePluginManager()
    later.register(LaterDecode(), name="later")
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
