"""An installed third-party warcore plugin changes the branch the real barrier takes; a plugin
that tries to answer earlier than sglang's own does not; a raising plugin gives the coarse fence
and is named in the log; WARCORE_FORCE_COARSE makes every barrier coarse. Asserted on the trace
of the real ``Scheduler._apply_war_barrier`` calls."""

from __future__ import annotations

from _servers import Servers


def test_the_fork_backend_publishes_its_prefill_early_under_sglang_alone(servers: Servers) -> None:
    run = servers["fork_alone"]
    extend = run.prefills()
    assert len(extend) == 4  # two waves, plain and tagged: one prefill batch each
    for b in extend:
        assert b["event"] is True and b["branch"] == "wait_event", b
        assert b["record_point"] == "pre_replay"
        assert b["publisher"] == "EagerRunner._execute_extend"
        assert b["backend"] == "ForkNativeAttnBackend"
        assert b["provenance"] == "sglang:ForkNativeAttnBackend.shared_read_ends"
    # sglang's eager decode publishes nothing, whatever the backend declares
    decode = run.barriers(mode="DECODE")
    assert decode and all(b["branch"] == "wait_stream" and not b["event"] for b in decode)


def test_a_warcore_plugin_declaring_post_replay_makes_the_real_barrier_wait_for_the_stream(
    servers: Servers,
) -> None:
    run = servers["fork_late"]
    extend = run.prefills()
    assert len(extend) == 4
    for b in extend:
        assert b["event"] is False and b["branch"] == "wait_stream", b
        assert b["backend"] == "sglang_fork_native"  # warcore-sglang learned the fork's class
        assert b["declared"] == "POST_REPLAY"
        assert "fork_late: POST_REPLAY" in b["provenance"], b["provenance"]
    assert not run.kind("publish")  # nothing published early any more
    assert {b["branch"] for b in run.kind("barrier")} == {"wait_stream"}


def test_a_plugin_declaring_earlier_than_sglangs_own_answer_does_not_move_it(
    servers: Servers,
) -> None:
    run = servers["warcore_http"]
    extend = run.prefills()
    assert len(extend) == 4  # two waves, plain and tagged
    for b in extend:
        # early_native says PRE_REPLAY for torch_native's prefill; sglang's UNKNOWN stands
        assert b["branch"] == "wait_stream" and b["event"] is False, b
        assert b["declared"] == "UNKNOWN"
        assert b["backend"] == "sglang_torch_native"
        assert b["provenance"] == (
            "sglang:TorchNativeAttnBackend.shared_read_ends "
            "(later than plugin:early_native's PRE_REPLAY)"
        )
    assert not run.kind("publish")


def test_a_raising_plugin_gives_the_coarse_fence_and_is_named_in_the_log(servers: Servers) -> None:
    run = servers["fork_raiser"]
    extend = run.prefills()
    assert len(extend) == 2
    for b in extend:
        assert b["branch"] == "wait_stream" and b["event"] is False, b
        assert b["declared"] == "UNKNOWN"
        assert "fork_raiser" in b["provenance"] and "failed" in b["provenance"], b["provenance"]
    failures = [line for line in run.log_text().splitlines() if "fork_raiser" in line]
    assert any("ForkAuditError" in line for line in failures), run.log_tail()
    assert len(run.plain()) == 12  # and the server served every request


def test_force_coarse_makes_every_barrier_coarse(servers: Servers) -> None:
    run = servers["force_coarse"]
    barriers = run.kind("barrier")
    assert len(barriers) > 10
    assert {b["branch"] for b in barriers} == {"wait_stream"}
    assert not run.kind("publish")
    assert {b["provenance"] for b in run.prefills()} == {"forced-coarse"}
