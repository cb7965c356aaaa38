"""warcore in every scheduler actor of sglang's ``RayEngine``, without user code.

With ``WARCORE_SGLANG=1`` where the engine is built, each ``SchedulerActor`` says one start-up
line, active, naming the ranks sglang published for it, at tp 1, tp 2 and across two Ray nodes;
every barrier of those runs is warcore's; the tokens are those of the engine without warcore
(greedy: warcore moves where a barrier waits, never what a forward computes). An actor where
warcore cannot activate says so in one line, and serves."""

from __future__ import annotations

import pytest
from _rays import WAVES, Run, Runs
from warcore_sglang._ray import WRAPPED
from warcore_sglang.releases import RELEASES

VERSION = list(RELEASES)[-1]


def _actors(run: Run) -> list[dict[str, object]]:
    return sorted(
        (r for r in run.kind("process") if r["role"] == "scheduler"),
        key=lambda r: str(r["rank"]),
    )


def test_the_engine_leaves_warcore_to_its_actors_and_says_so(runs: Runs) -> None:
    (engine,) = [r for r in runs["tp1"].kind("process") if r["role"] == "engine"]
    assert engine["left_to_schedulers"] is True, engine
    assert "warcore left to the scheduler processes" in str(engine["line"]), engine
    assert f"; {WRAPPED}" in str(engine["line"]), engine


@pytest.mark.parametrize(("name", "tps"), [("tp1", [0]), ("tp2", [0, 1]), ("nodes", [0, 1])])
def test_each_actor_is_active_once_named_by_the_ranks_sglang_published(
    runs: Runs, name: str, tps: list[int]
) -> None:
    run = runs[name]
    actors = _actors(run)
    assert [a["rank"] for a in actors] == [{"tp": tp, "pp": 0, "dp": 0} for tp in tps], actors
    for actor in actors:
        assert actor["active"] is True, actor["line"]
        who = f"process {actor['pid']} (scheduler, tp {actor['rank']['tp']}, pp 0, dp 0)"  # type: ignore[index]
        said = run.said(f"warcore-sglang: {who}")
        assert len(said) == 1, said
        assert f"{who}: warcore active on sglang {VERSION} in " in said[0], said


def test_the_two_node_actors_run_on_the_two_nodes(runs: Runs) -> None:
    """Each actor is a worker of its node's raylet."""
    nodes = {runs.raylets.get(int(a["ppid"])) for a in _actors(runs["nodes"])}  # type: ignore[call-overload]
    assert nodes == {"head", "node2"}, (nodes, runs.raylets)


@pytest.mark.parametrize(
    ("name", "alone"), [("tp1", "broken"), ("tp2", "alone"), ("nodes", "alone")]
)
def test_every_barrier_is_warcores_and_the_tokens_are_sglangs_own(
    runs: Runs, name: str, alone: str
) -> None:
    """Against the same tp without warcore (tp 2's tokens are not tp 1's: its sums run in
    another order; here one request of twelve differs from its first token on)."""
    run, without = runs[name], runs[alone]
    asked = {r.rid: r.max_new_tokens for wave in WAVES for r in wave}
    assert {rid: len(ids) for rid, ids in without.tokens.items()} == asked
    assert run.tokens == without.tokens
    barriers = run.kind("barrier")
    assert barriers and all(b["warcore"] for b in barriers), barriers[:3]
    assert {b["mode"] for b in barriers} >= {"EXTEND", "DECODE"}


def test_without_warcore_each_actor_says_so_and_no_barrier_is_warcores(runs: Runs) -> None:
    alone = runs["alone"]
    actors = _actors(alone)
    assert [a["rank"] for a in actors] == [{"tp": tp, "pp": 0, "dp": 0} for tp in (0, 1)]
    for actor in actors:
        assert actor["active"] is False and "WARCORE_SGLANG=''" in str(actor["reason"]), actor
        assert len(alone.said(f"warcore-sglang: process {actor['pid']} (")) == 1
    barriers = alone.kind("barrier")
    assert barriers and not any(b["warcore"] for b in barriers), barriers[:3]


def test_an_actor_where_warcore_cannot_activate_says_so_in_one_line_and_serves(
    runs: Runs,
) -> None:
    broken = runs["broken"]
    said = broken.said("warcore-sglang: process ")
    actor = [ln for ln in said if "(scheduler actor)" in ln]
    assert len(actor) == 1, said
    assert (
        "warcore NOT active: warcore_sglang cannot be imported here: ImportError: "
        "warcore-sglang is broken on this node" in actor[0]
    ), actor
    assert not any("warcore active" in ln for ln in said), said
    # nothing of warcore in the actor: the trace holds the engine's process alone
    assert [r["role"] for r in broken.kind("process")] == ["engine"], broken.kind("process")
    assert not broken.kind("barrier")


def test_a_driver_whose_actors_die_while_serving_ends_at_once_in_one_line(runs: Runs) -> None:
    """sglang's ``RayEngine`` does not watch its actors: an actor whose event loop dies leaves
    the request waiting (the trial's "never returned"). The harness's driver reads the loops'
    end and stops, long before its bound; the actor's own error is in the log."""
    dies = runs["dies"]
    assert dies.returncode == 3 and dies.seconds < 150, (dies.returncode, dies.seconds)
    assert dies.said("driver: a scheduler actor's event loop ended while serving"), dies.log
    assert dies.said("Ray scheduler actor terminated with error"), dies.log
    assert dies.said("InvalidCxxCompiler: No working C++ compiler found"), dies.log
