"""warcore is active in the real scheduler child, with the plugins it loaded; where it is
installed but not activated, sglang decides alone. Asserted on the trace the processes wrote."""

from __future__ import annotations

from _servers import Servers


def test_warcore_is_active_in_the_scheduler_child_with_its_plugins(servers: Servers) -> None:
    run = servers["warcore_http"]
    scheduler = run.scheduler()
    assert scheduler["active"] is True, scheduler
    loaded = {p["name"]: p for p in scheduler["plugins"] if p["status"] == "active"}
    # WARCORE_PLUGINS=early_native: that entry point loaded (and the core's own built-ins),
    # the other installed ones disabled by the allowlist
    assert set(loaded) == {"warcore", "early_native"}, scheduler["plugins"]
    assert loaded["early_native"]["distribution"] == "warcore-sglang-test-plugins"
    others = {p["name"]: p["status"] for p in scheduler["plugins"] if p["name"] not in loaded}
    assert {"sglang", "fork_late", "fork_raiser"} <= set(others), others
    assert set(others.values()) == {"disabled"}, others
    # the child is a child: spawned by the launcher, which builds no model runner and leaves
    # warcore to its scheduler (so does the detokenizer)
    others = {r["role"]: r for r in run.kind("process") if r["pid"] != scheduler["pid"]}
    assert others["launcher"]["pid"] == scheduler["ppid"], run.kind("process")
    assert set(others) == {"launcher", "detokenizer"}
    for record in others.values():
        assert record["active"] is False and record["left_to_schedulers"] is True, record
    # its barriers: every one written by that process, all with warcore answering
    barriers = run.kind("barrier")
    assert barriers and {b["pid"] for b in barriers} == {scheduler["pid"]}
    assert all(b["warcore"] for b in barriers)
    assert {b["rank"]["tp"] for b in barriers} == {0}
    # one start-up line per process in the server's log, saying the same
    log = run.log_text()
    for record in run.kind("process"):
        assert record["line"] in log, record["line"]
    took = scheduler["activation_s"]
    assert 0 < took < 30, took
    assert (
        f"process {scheduler['pid']} (scheduler, tp 0, pp 0): warcore active on sglang 0.5.23 in "
        f"{took:.3f} s; "
        "plugins:" in log
    )


def test_installed_but_not_activated_leaves_sglang_deciding(servers: Servers) -> None:
    run = servers["fork_alone"]
    processes = run.kind("process")
    assert {p["role"] for p in processes} == {"engine", "scheduler", "detokenizer"}
    for p in processes:
        assert p["active"] is False and "WARCORE_SGLANG=''" in p["reason"], p
    barriers = run.kind("barrier")
    assert barriers and not any(b["warcore"] for b in barriers)
    # every decision is sglang's own: its classes' declarations, its eager runner
    assert all(b["provenance"].startswith("sglang") for b in barriers), {
        b["provenance"] for b in barriers
    }
    # the fork backend's own (early) prefill answer, published before the forward: the branch
    # sglang takes without warcore-sglang installed at all; its eager decode publishes nothing
    assert {b["branch"] for b in run.prefills()} == {"wait_event"}
    assert {b["declared"] for b in run.prefills()} == {"PRE_REPLAY"}
    assert {b["branch"] for b in run.barriers(mode="DECODE")} == {"wait_stream"}
