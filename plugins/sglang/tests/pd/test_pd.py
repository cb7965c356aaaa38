"""warcore-sglang inside sglang's real prefill/decode disaggregation (issue 41): a prefill and a
decode server, the Mooncake transfer engine over TCP on 127.0.0.1, ``sglang-router`` in front
(``conftest.py``). Asserted on what the real processes returned, said and traced."""

from __future__ import annotations

import re

from conftest import CONCURRENCY, WAVES, Runs
from warcore_sglang.audit import sanitize

LOOPS = {
    "prefill": "event_loop_overlap_disagg_prefill",
    "decode": "event_loop_overlap_disagg_decode",
}
WARCORE_ORDER = "warcore: forward stream synchronized"


def test_the_decode_sides_tokens_are_a_plain_servers(runs: Runs) -> None:
    plain, run = runs["plain"].plain(), runs["warcore"].plain()
    assert len(plain) == sum(len(w) for w in WAVES) and plain == run, (plain, run)


def test_each_scheduler_says_its_role_and_ranks(runs: Runs) -> None:
    run = runs["warcore"]
    for side in ("prefill", "decode"):
        (process,) = [p for p in run.kind(side, "process") if p["active"]]
        line = re.compile(
            rf"warcore-sglang: process {process['pid']} \({side} scheduler, tp 0, pp 0"
            r"(, dp 0)?\): warcore active on sglang 0\.5\.23"
        )
        assert line.search(run.logs[side]), [
            x for x in run.logs[side].splitlines() if "warcore-sglang: process" in x
        ]
        assert process["rank"]["tp"] == 0 and process["rank"]["pp"] == 0, process


def test_every_barrier_of_both_loops_is_answered_by_warcore(runs: Runs) -> None:
    run = runs["warcore"]
    for side, loop in LOOPS.items():
        barriers = run.kind(side, "barrier")
        (scheduler,) = [p["pid"] for p in run.kind(side, "process") if p["active"]]
        assert barriers and {b["loop"] for b in barriers} == {loop}, {b["loop"] for b in barriers}
        assert {b["pid"] for b in barriers} == {scheduler}
        assert all(b["warcore"] and b["branch"] != "disabled" for b in barriers), barriers
    # every request's prefill ran behind a barrier on the prefill side, its decode steps on the
    # decode side
    ours = {r.rid for wave in WAVES for r in wave}
    prefilled = {rid for b in run.kind("prefill", "barrier") for rid in b.get("rids", [])}
    assert ours <= prefilled, ours - prefilled
    decode_modes = {b["mode"] for b in run.kind("decode", "barrier")}
    assert "DECODE" in decode_modes, decode_modes


def test_the_sanitizer_over_both_sides_passes(runs: Runs) -> None:
    run = runs["warcore"]
    records = run.records["prefill"] + run.records["decode"]
    report = sanitize.compare(records, run.plain(), run.poisoned())
    assert report.ok and report.compared == CONCURRENCY * 2, report.lines()
    assert all(
        p["sanitize"] == "tagged" for s in LOOPS for p in run.kind(s, "process") if p["active"]
    )


def test_the_rank_check_agrees_within_each_side(runs: Runs) -> None:
    run = runs["warcore"]
    for side in LOOPS:
        assert "warcore: all 1 ranks resolved the same read-done decisions" in run.logs[side], side
        assert run.logs[side].count("the rank check took") == 1, side


def test_a_decode_server_without_warcore_is_refused_in_one_line(runs: Runs) -> None:
    run = runs["mixed"]
    assert not run.tokens and run.error and run.request_s < 60.0, (run.error, run.request_s)
    # said once, where the peer registers (each request routed to it then fails with the
    # same reason, in sglang's own per-request line)
    refusals = [x for x in run.logs["prefill"].splitlines() if "Rejecting state" in x]
    assert len(refusals) == 1, run.logs["prefill"][-3000:]
    assert "pairing refused" in refusals[0]
    assert "does not have warcore active, this prefill server does" in refusals[0]
    assert re.search(r"decode peer 127\.0\.0\.1:\d+ \(tp rank 0", refusals[0]), refusals[0]
    (decode,) = [p for p in run.kind("decode", "process") if p["role"].endswith("scheduler")]
    assert not decode["active"]


def test_transferred_slots_wait_for_the_forward_in_flight(runs: Runs) -> None:
    """The transfer-write audit (docs/sglang-pd.md): new requests are given slots the forward
    in flight still reads and writes (``shared``), and warcore hands them to the transfer
    engine only after that forward; removing the wait (or the decode loop's barrier, which
    orders the ``req_to_token`` rows) fails here."""
    transfers = runs["warcore"].kind("decode", "transfer")
    assert len(transfers) >= sum(len(w) for w in WAVES), transfers
    reused = [t for t in transfers if t["shared"] and t["in_flight"]]
    assert reused, transfers  # the hazard is real here: slots of the forward in flight reused
    assert all(t["ordered"] == WARCORE_ORDER for t in transfers if t["in_flight"]), transfers
    # each transfer comes after the barrier that followed the last forward's launch
    records = runs["warcore"].records["decode"]
    for t in reused:
        before = records[: records.index(t)]
        barriers = [r for r in before if r["kind"] == "barrier"]
        assert barriers and barriers[-1]["loop"] == LOOPS["decode"], t
