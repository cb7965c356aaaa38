"""Two tensor-parallel ranks of a real sglang server (issue 28): each rank is its own scheduler
process deciding on its own. Asserted on the start-up lines, the logs and the traces the real
processes wrote: every rank active with the same plugins and the rank check agreeing, over the
Engine API and over HTTP, the tokens sglang gives alone; refused at start-up, every process
ending, when the ranks would decide differently (a rank-dependent plugin, a plugin failing on
one rank) or a rank dies or hangs before answering; under ``warn`` served, the disagreeing
cells coarse on every rank; and a real per-rank divergence, unchecked, named by the trace
comparison."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _servers import RANK_TIMEOUT_S, TIMEOUT, Servers
from warcore_sglang.audit.trace_ranks import compare_ranks

AGREE = "warcore: all 2 ranks resolved the same read-done decisions"
DISAGREE = "warcore: ranks disagree on read-done decisions: rank(s) 1 differ from rank 0"
FORK_PREFILL = "backend 'sglang_fork_native', mode EXTEND"


@pytest.mark.parametrize("name", ["tp2_engine", "tp2_http"])
def test_every_rank_is_active_with_the_same_plugins_and_the_check_agrees(
    servers: Servers, name: str
) -> None:
    run = servers[name]
    schedulers = run.schedulers()
    assert [s["rank"]["tp"] for s in schedulers] == [0, 1], schedulers
    loaded = [
        sorted((p["name"], p["distribution"]) for p in s["plugins"] if p["status"] == "active")
        for s in schedulers
    ]
    assert all(s["active"] for s in schedulers), schedulers
    assert loaded[0] == loaded[1] and ("sglang", "warcore-sglang") in loaded[0], loaded
    log = run.log_text()
    for s in schedulers:  # one start-up line per rank, saying so
        assert f"process {s['pid']} (scheduler, tp {s['rank']['tp']}, pp 0): warcore active" in log
    assert log.count(AGREE) == 2, run.log_tail()  # said by each rank
    assert log.count("the rank check took") == 2
    barriers = run.kind("barrier")
    assert {b["pid"] for b in barriers} == {s["pid"] for s in schedulers}
    assert all(b["warcore"] for b in barriers)


@pytest.mark.parametrize("name", ["tp2_engine", "tp2_http"])
def test_the_tokens_are_sglangs_own_at_tp_2(servers: Servers, name: str) -> None:
    alone, run = servers["tp2_alone"], servers[name]
    assert not any(s["active"] for s in alone.schedulers())
    assert run.plain() == alone.plain() and alone.plain(), (run.plain(), alone.plain())


def test_the_ranks_agree_batch_by_batch(servers: Servers) -> None:
    run = servers["tp2_engine"]
    comparison = compare_ranks([run.records])
    assert comparison.agree, comparison.lines()
    [group] = comparison.groups
    counts = list(group.barriers.values())
    assert len(counts) == 2 and counts[0] == counts[1] > 0, group.barriers
    done = _summary(run.trace_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every rank took the same record point and barrier on every batch" in done.stdout


def _summary(*paths: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warcore_sglang.audit.trace", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(servers: Servers, name: str) -> str:
    """The refused start-up of ``name``: it ended by itself, leaving no process behind; its
    log."""
    run = servers[name]
    assert run.extra["returncode"] != 0, run.log_tail()
    assert run.extra["leftover"] == [], (run.extra, run.log_tail())
    assert len(run.extra["pids"]) >= 2  # both scheduler ranks were seen
    return run.log_text()


def _cell(log: str, cell: str) -> str:
    return next(line for line in log.splitlines() if line.strip().startswith(cell))


def test_plugins_answering_differently_or_failing_on_one_rank_are_refused_at_start_up(
    servers: Servers,
) -> None:
    """On rank 1 ``by_rank`` declares the fork backend's prefill later and ``rank_raiser`` fails
    on its decode: both cells named, each with both ranks' decisions."""
    log = _refused(servers, "tp2_by_rank")
    assert DISAGREE in log, log[-3000:]
    assert "rank 1: 2 cell(s) differ from rank 0:" in log
    prefill = _cell(log, FORK_PREFILL)
    # rank 0: sglang's own PRE_REPLAY; rank 1: by_rank's later POST_REPLAY (it outvotes sglang)
    assert "rank 0 boundary=PRE_REPLAY record=pre_replay" in prefill, prefill
    assert "rank 1 boundary=POST_REPLAY record=none" in prefill and "default:conflict" in prefill
    decode = _cell(log, "backend 'sglang_fork_native', mode DECODE")
    assert "rank 1 boundary=UNKNOWN" in decode and "default:failed:rank_raiser" in decode, decode
    assert "by_rank=warcore-sglang-test-plugins 0.1.0 (active)" in log


def test_a_rank_that_dies_before_the_check_ends_the_others_within_the_timeout(
    servers: Servers,
) -> None:
    """sglang's own supervisor sees the rank die and ends the others, naming it, long before
    warcore's rank check would time out (60 s by default)."""
    run = servers["tp2_dying"]
    log = _refused(servers, "tp2_dying")
    assert "Rank 1 scheduler died during initialization (exit code: 17)" in log, log[-3000:]
    assert run.extra["seconds"] < TIMEOUT, run.extra


def test_a_rank_that_never_answers_is_named_when_the_check_times_out(servers: Servers) -> None:
    """A rank that hangs (sglang's supervisor sees nothing wrong): rank 0's check names it
    after WARCORE_SGLANG_CHECK_RANKS_TIMEOUT, rank 0's start-up fails, and sglang ends the
    rest, the hanging rank included."""
    log = _refused(servers, "tp2_stalled")
    said = f"rank(s) 1 did not answer within {RANK_TIMEOUT_S:g} s; rank(s) 0 did (group of 2"
    assert said in log, log[-3000:]


def test_warn_serves_with_the_disagreeing_cells_coarse_on_every_rank(servers: Servers) -> None:
    run, alone = servers["tp2_warn"], servers["tp2_alone"]
    log = run.log_text()
    assert DISAGREE in log and FORK_PREFILL in log, run.log_tail()
    assert log.count("the ranks disagree on 1 cell(s)") == 2, run.log_tail()
    assert run.plain() == alone.plain()
    prefills = run.prefills()
    assert {b["rank"]["tp"] for b in prefills} == {0, 1}
    for b in prefills:  # sglang alone: wait_event (the fork's PRE_REPLAY); here coarse
        assert (b["branch"], b["event"]) == ("wait_stream", False), b
        assert b["provenance"] == "ranks disagree (WARCORE_SGLANG_CHECK_RANKS=warn)", b
    assert {b["branch"] for b in alone.prefills()} == {"wait_event"}
    assert compare_ranks([run.records]).agree


def test_a_real_per_rank_divergence_is_reported_with_both_decisions(servers: Servers) -> None:
    run = servers["tp2_divergent"]
    assert "rank check" not in run.log_text()  # unchecked: the ranks serve as they decided
    comparison = compare_ranks([run.records])
    assert not comparison.agree
    prefills = {b["step"] for b in run.prefills() if b["rank"]["tp"] == 0}
    assert {d.batch for d in comparison.divergences} == prefills, comparison.lines()
    done = _summary(run.trace_path)
    assert done.returncode == 1, done.stdout + done.stderr
    first = comparison.divergences[0].line()
    assert first in done.stdout
    assert "tp 0 mode=EXTEND record_point=pre_replay branch=wait_event" in first, first
    assert "tp 1 mode=EXTEND record_point=none branch=wait_stream" in first, first
