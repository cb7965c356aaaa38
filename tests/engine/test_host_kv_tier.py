"""The host KV tier behind the ``hicache`` flag: a prefix cache written through to host memory
and loaded back on its own stream, ordered behind the schedule stream only (sglang's shape).

Its two hazards, each shown corrupting tokens under overlap on ``sim`` without its protection
and caught by the tier's order check deterministically: the offload of a prompt whose prefill
is still in flight (the built-in veto of the prefill fast path is the protection), and a
load-back into slots a launched forward still reads (the deferred free rule: a device wait on
the done event of the newest step that may touch them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from warcore import ForwardMode, hookimpl
from warcore.audit.host_buffers import sanitize_host_kv_tier
from warcore.cli import main
from warcore.core import AlgorithmSpec, StepFacts
from warcore.engine import Engine, EngineConfig, RunReport, synthetic_trace
from warcore.engine import builtin_plugin as core
from warcore.engine.hicache import copy_order_problem, slot_ready_step
from warcore.testing import make_plugin_manager

HICACHE = (("hicache", True),)
TRIES = 3
"""Race runs: a hazard must corrupt tokens in at least one of this many runs."""
LAYER_S = 0.003
"""Modelled device time per layer: a forward outlasts the tier's copies, as on a GPU."""
# Short outputs: many prompts finish at their prefill (so the offload races it) and slots are
# freed while the forward that last reads them is in flight (so the load-back races it).
RACE_TRACE = synthetic_trace(32, seed=1, prompts="shared", output_len=(1, 3), mean_gap_steps=0.5)
TRACE = synthetic_trace(24, seed=2, prompts="shared", output_len=(1, 12))


class NoVetoAlgorithms:
    """The core's algorithms, publish phases and owners, without its veto: the prefill fast
    path stays on although ``hicache`` is."""

    @hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        return core.warcore_speculative_algorithms()

    @hookimpl
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        return core.warcore_is_war_publish_phase(algorithm, forward_mode)

    @hookimpl
    def warcore_step_event_owner(self, algorithm: str, facts: StepFacts) -> str | None:
        return core.warcore_step_event_owner(algorithm, facts)


def _run(trace: list[Any], pm: Any = None, **options: Any) -> RunReport:
    with Engine(EngineConfig(**options), device="sim", pm=pm) as engine:
        return engine.run(trace)


@pytest.fixture(scope="module")
def wctest_plain() -> RunReport:
    """Serial greedy decoding of TRACE without the tier."""
    return _run(TRACE, loop="serial")


@pytest.fixture(scope="module")
def wctest_expected(wctest_plain: RunReport) -> dict[int, list[int]]:
    """Its tokens: the oracle."""
    return wctest_plain.outputs


@pytest.fixture(scope="module")
def wctest_race_expected() -> dict[int, list[int]]:
    """The same for RACE_TRACE."""
    return _run(RACE_TRACE, loop="serial").outputs


def _wrong(report: RunReport, expected: dict[int, list[int]]) -> list[int]:
    return [rid for rid, out in expected.items() if report.outputs.get(rid) != out]


# -- the cache --------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_shared_prefixes_are_loaded_back_and_tokens_equal_plain_serial(
    algorithm: str, wctest_plain: RunReport
) -> None:
    expected = wctest_plain.outputs
    report = _run(TRACE, algorithm=algorithm, flags=HICACHE)
    pc = report.prefix_cache
    assert pc is not None
    assert pc.lookups == len(TRACE)
    assert pc.hits >= len(TRACE) // 2 and pc.tokens_loaded >= 4 * pc.hits
    assert pc.tokens_offloaded > 0 and pc.copies_checked > 0
    assert pc.unordered == []
    assert report.outputs == expected
    # Rows are not deferred: the same admissions reuse them as without the tier.
    assert report.rows_reused > 0
    if algorithm == "none":  # (speculation collects finishes a step later under overlap)
        assert report.rows_reused == wctest_plain.rows_reused


def test_the_prefill_reads_the_loaded_kv_instead_of_recomputing_it(
    wctest_expected: dict[int, list[int]],
) -> None:
    """A load-back of wrong K/V changes the tokens (the serial loop: no race involved), so
    the prefill of a hit really attends over what came back from host memory."""
    expected = wctest_expected
    with Engine(EngineConfig(loop="serial", flags=HICACHE), device="sim") as engine:
        tier = engine.tier
        assert tier is not None
        released = tier.released

        def poisoned(*args: Any, **kwargs: Any) -> None:
            released(*args, **kwargs)
            tier._work.append(lambda: [t.fill_(3.0) for t in tier.host])

        tier.released = poisoned  # type: ignore[method-assign]
        report = engine.run(TRACE)
    assert report.prefix_cache is not None and report.prefix_cache.hits > 0
    assert _wrong(report, expected)


def test_a_full_host_tier_evicts_the_least_recently_used_prefixes(
    wctest_expected: dict[int, list[int]],
) -> None:
    expected = wctest_expected
    report = _run(TRACE, flags=HICACHE, hicache_host_tokens=24)
    pc = report.prefix_cache
    assert pc is not None and pc.evictions > 0 and pc.hits > 0
    assert report.outputs == expected


def test_without_the_flag_there_is_no_tier() -> None:
    with Engine(EngineConfig(), device="sim") as engine:
        assert engine.tier is None
        assert engine.run(TRACE[:4]).prefix_cache is None


@pytest.mark.parametrize(("field", "value"), [("hicache_block", 0), ("hicache_host_tokens", True)])
def test_bad_tier_settings_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})
    with pytest.raises(ValueError, match="at least one block"):
        EngineConfig(hicache_host_tokens=2, hicache_block=4)


def test_warcore_run_reports_the_hit_rate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--device", "sim", "--requests", "16", "--no-verify", "--flag", "hicache"]
    assert main([*argv, "--prompts", "shared"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "prefix cache" in x)
    assert "prefills hit" in line and "prompt tokens loaded back" in line
    assert "0/16 prefills hit" not in line
    assert "0 unordered" in out
    # Prompts repeating the same motif share prefixes: the repetitive trace hits too.
    assert main([*argv, "--prompts", "repetitive"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "prefix cache" in x)
    assert "0/16 prefills hit" not in line and "0 unordered" in out


# -- the order rule ---------------------------------------------------------------------------
def test_the_order_rule_is_a_comparison_of_steps() -> None:
    assert copy_order_problem("offload", 3, 3) is None
    assert copy_order_problem("load-back", 2, 5) is None
    problem = copy_order_problem("load-back", 6, 5)
    assert problem is not None and "step 6" in problem and "step 5" in problem
    freed_at = [0, 4, 7, 2]
    assert slot_ready_step(freed_at, [1, 3]) == 4
    assert slot_ready_step(freed_at, [2, 1]) == 7
    assert slot_ready_step(freed_at, []) == 0


# -- hazard 1: offload while the prefill runs (the veto) --------------------------------------
@pytest.mark.plugins("trtllm_mha")  # its prefill publishes early: the fast path
def test_without_the_veto_the_offload_races_the_prefill_and_the_check_catches_it(
    wctest_race_expected: dict[int, list[int]],
) -> None:
    """trtllm_mha's prefill publishes before its replay; with the veto (hicache on) the
    schedule stream, and so the offload behind it, waits for the whole prefill. Without it
    the offload copies K/V the prefill has not written yet, and a later hit loads that."""
    expected = wctest_race_expected
    veto = make_plugin_manager(entry_points=["trtllm_mha"])
    none = make_plugin_manager(NoVetoAlgorithms(), entry_points=["trtllm_mha"], builtins="none")
    options = {"backend": "trtllm_mha", "flags": HICACHE, "modelled_layer_s": LAYER_S}
    vetoed = _run(RACE_TRACE, veto, **options)
    assert vetoed.outputs == expected
    assert vetoed.prefix_cache is not None and vetoed.prefix_cache.unordered == []
    assert vetoed.barriers["coarse"] >= vetoed.forwards[ForwardMode.EXTEND]
    corrupted = False
    for _ in range(TRIES):
        raced = _run(RACE_TRACE, none, **options)
        assert raced.barriers["coarse"] == 0  # every prefill took its early event
        pc = raced.prefix_cache
        assert pc is not None and pc.unordered  # deterministic, whatever the interleaving
        assert all(u.startswith("offload") for u in pc.unordered)
        if _wrong(raced, expected):
            corrupted = True
            break
    assert corrupted, f"no token corrupted in {TRIES} runs without the veto"


# -- hazard 2: load-back into slots a forward still reads (the deferred free rule) ------------
def test_a_load_back_waits_for_the_forward_still_reading_its_freed_slots(
    wctest_race_expected: dict[int, list[int]],
) -> None:
    """The default backend and the veto: a decode's read-done event is recorded before its
    layers read K/V, so slots freed by a request it finishes are still read after the event.
    The load-back into them waits on that step's done event (a device wait); without the
    rule it overwrites them under the running forward."""
    expected = wctest_race_expected
    options = {"flags": HICACHE, "modelled_layer_s": LAYER_S}
    ruled = _run(RACE_TRACE, **options)
    assert ruled.outputs == expected
    pc = ruled.prefix_cache
    assert pc is not None and pc.unordered == [] and pc.done_waits > 0
    corrupted = False
    for _ in range(TRIES):
        raced = _run(RACE_TRACE, hicache_deferred_free=False, **options)
        pc = raced.prefix_cache
        assert pc is not None and pc.done_waits == 0
        assert pc.unordered and all(u.startswith("load-back") for u in pc.unordered)
        if _wrong(raced, expected):
            corrupted = True
            break
    assert corrupted, f"no token corrupted in {TRIES} runs without the deferred free rule"


@pytest.mark.plugins("trtllm_mha")  # its prefill publishes early: the fast path
def test_the_tier_sanitizer_flags_both_hazards_the_same_way_every_run() -> None:
    """No modelled device time, no race needed: the verdict is bookkeeping of the fences."""
    none = make_plugin_manager(NoVetoAlgorithms(), entry_points=["trtllm_mha"], builtins="none")
    trtllm = EngineConfig(backend="trtllm_mha")
    unvetoed = [sanitize_host_kv_tier(trtllm, RACE_TRACE, pm=none).unordered for _ in range(2)]
    assert unvetoed[0] and unvetoed[0] == unvetoed[1]
    assert all(u.startswith("offload") for u in unvetoed[0])
    early = EngineConfig(hicache_deferred_free=False)
    assert sanitize_host_kv_tier(early, RACE_TRACE).unordered
    assert sanitize_host_kv_tier(EngineConfig(), RACE_TRACE).clean
    veto = make_plugin_manager(entry_points=["trtllm_mha"])
    assert sanitize_host_kv_tier(trtllm, RACE_TRACE, pm=veto).clean
