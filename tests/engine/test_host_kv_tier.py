"""The prefix cache behind the ``hicache`` flag: finished prompts' blocks kept on the device and
shared by reference, written through to host memory, evicted from the device under pressure and
loaded back on the tier's own stream, ordered behind the schedule stream only (sglang's shape).

Its two hazards, each shown corrupting tokens under overlap on ``sim`` without its protection
and caught by the tier's order check deterministically: the offload of a prompt whose prefill
is still in flight (the built-in veto of the prefill fast path is the protection), and a
load-back into slots a launched forward still reads (the deferred free rule: a device wait on
the done event of the newest step that may touch them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch

from warcore import ForwardMode, hookimpl
from warcore.audit.host_buffers import sanitize_host_kv_tier
from warcore.batch import KVPool
from warcore.cli import main
from warcore.core import AlgorithmSpec, StepFacts
from warcore.device import get_device
from warcore.engine import Engine, EngineConfig, ModelConfig, RunReport, synthetic_trace
from warcore.engine import builtin_plugin as core
from warcore.engine.hicache import HostKVTier, copy_order_problem, slot_ready_step
from warcore.testing import make_plugin_manager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

HICACHE = (("hicache", True),)
TRIES = 3
"""Race runs: a hazard must corrupt tokens in at least one of this many runs."""
LAYER_S = 0.003
"""Modelled device time per layer: a forward outlasts the tier's copies, as on a GPU."""
# Short outputs: many prompts finish at their prefill (so the offload races it) and slots are
# freed while the forward that last reads them is in flight (so the load-back races it).
RACE_TRACE = synthetic_trace(32, seed=1, prompts="shared", output_len=(1, 3), mean_gap_steps=0.5)
TRACE = synthetic_trace(24, seed=2, prompts="shared", output_len=(1, 12))
PRESSURE = 128
"""A KV pool this small (slots) cannot keep every cached block: the device tier evicts, and
hits on evicted blocks load them back from host memory."""


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
def test_shared_prefixes_are_shared_on_the_device_and_tokens_equal_plain_serial(
    algorithm: str, wctest_plain: RunReport
) -> None:
    """A pool with room for everything: every hit shares the device blocks, nothing is
    evicted or loaded back, and the shared blocks are written through to host memory."""
    expected = wctest_plain.outputs
    report = _run(TRACE, algorithm=algorithm, flags=HICACHE)
    pc = report.prefix_cache
    assert pc is not None
    assert pc.lookups == len(TRACE)
    assert pc.hits >= len(TRACE) // 2 and pc.tokens_shared >= 4 * pc.hits
    assert pc.tokens_loaded == 0 and pc.device_evictions == 0 and pc.done_waits == 0
    assert pc.tokens_offloaded > 0 and pc.copies_checked > 0
    assert pc.unordered == []
    assert report.outputs == expected
    # Rows are not deferred: the same admissions reuse them as without the tier.
    assert report.rows_reused > 0


@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_under_pool_pressure_blocks_are_evicted_and_loaded_back(
    algorithm: str, wctest_plain: RunReport
) -> None:
    expected = wctest_plain.outputs
    report = _run(TRACE, algorithm=algorithm, flags=HICACHE, num_slots=PRESSURE)
    pc = report.prefix_cache
    assert pc is not None
    assert pc.device_evictions > 0 and pc.tokens_loaded > 0 and pc.tokens_shared > 0
    assert pc.unordered == []
    assert report.outputs == expected
    # Without the cache the same pool serves the same tokens (it only ever evicts).
    assert _run(TRACE, algorithm=algorithm, num_slots=PRESSURE).outputs == expected


def test_the_prefill_reads_the_shared_device_kv_instead_of_recomputing_it(
    wctest_expected: dict[int, list[int]],
) -> None:
    """Poisoning the blocks the device tier keeps changes the tokens (the serial loop: no race
    involved), so a hit really maps the shared slots and attends over them (that it does not
    write them is the load-back test's: it would overwrite loaded K/V)."""
    with Engine(EngineConfig(loop="serial", flags=HICACHE), device="sim") as engine:
        tier, pool = engine.tier, engine.pool
        assert tier is not None
        released = tier.released

        def poisoned(*args: Any, **kwargs: Any) -> Any:
            freed = released(*args, **kwargs)
            kept = [s for blk in tier.on_device.values() for s in blk.slots or []]
            tier._work.append(
                lambda: [t.index_fill_(1, torch.tensor(kept), 3.0) for t in (pool.k, pool.v)]
            )
            return freed

        tier.released = poisoned  # type: ignore[method-assign]
        report = engine.run(TRACE)
    assert report.prefix_cache is not None and report.prefix_cache.tokens_shared > 0
    assert _wrong(report, wctest_expected)


def test_the_prefill_reads_the_loaded_kv_instead_of_recomputing_it(
    wctest_expected: dict[int, list[int]],
) -> None:
    """A load-back of wrong K/V changes the tokens (the serial loop: no race involved), so
    the prefill of a hit really attends over what came back from host memory."""
    expected = wctest_expected
    config = EngineConfig(loop="serial", flags=HICACHE, num_slots=PRESSURE)
    with Engine(config, device="sim") as engine:
        tier = engine.tier
        assert tier is not None
        released = tier.released

        def poisoned(*args: Any, **kwargs: Any) -> Any:
            freed = released(*args, **kwargs)
            tier._work.append(lambda: [t.fill_(3.0) for t in tier.host])
            return freed

        tier.released = poisoned  # type: ignore[method-assign]
        report = engine.run(TRACE)
    assert report.prefix_cache is not None and report.prefix_cache.tokens_loaded > 0
    assert _wrong(report, expected)


def test_a_full_host_tier_evicts_the_least_recently_used_prefixes(
    wctest_expected: dict[int, list[int]],
) -> None:
    expected = wctest_expected
    report = _run(TRACE, flags=HICACHE, hicache_host_tokens=24, num_slots=PRESSURE)
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
    assert "prefills hit" in line and "shared on device" in line and "loaded back" in line
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
    options = {
        "backend": "trtllm_mha",
        "flags": HICACHE,
        "modelled_layer_s": LAYER_S,
        "num_slots": PRESSURE,
    }
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
    options = {"flags": HICACHE, "modelled_layer_s": LAYER_S, "num_slots": PRESSURE}
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
    trtllm = EngineConfig(backend="trtllm_mha", num_slots=PRESSURE)
    unvetoed = [sanitize_host_kv_tier(trtllm, RACE_TRACE, pm=none).unordered for _ in range(2)]
    assert unvetoed[0] and unvetoed[0] == unvetoed[1]
    assert all(u.startswith("offload") for u in unvetoed[0])
    early = EngineConfig(hicache_deferred_free=False, num_slots=PRESSURE)
    assert sanitize_host_kv_tier(early, RACE_TRACE).unordered
    assert sanitize_host_kv_tier(EngineConfig(num_slots=PRESSURE), RACE_TRACE).clean
    veto = make_plugin_manager(entry_points=["trtllm_mha"])
    assert sanitize_host_kv_tier(trtllm, RACE_TRACE, pm=veto).clean


# -- the cache's bookkeeping ------------------------------------------------------------------
def _tier(host_tokens: int = 64) -> HostKVTier:
    device = get_device("sim")
    pool = KVPool(ModelConfig(), device.torch_device, max_reqs=4, num_slots=64)
    return HostKVTier(pool, device, device.new_stream("hicache"), host_tokens=host_tokens, block=4)


def test_a_released_prompt_stays_on_the_device_and_is_written_through() -> None:
    tier = _tier()
    prompt = list(range(100, 110))  # two full blocks, then two tokens
    slots = list(range(1, 14))  # ten prompt positions and three output positions
    free, free_swa = tier.released(1, prompt, slots, [s + 20 for s in slots])
    assert free == slots[8:] and free_swa == [s + 20 for s in slots[8:]]
    assert tier.stats.tokens_offloaded == 8 and len(tier._work) == 1
    match = tier.match(prompt[:9] + [7, 7, 7])
    assert [blk.slots for blk in match.blocks] == [slots[:4], slots[4:8]]
    assert match.shared == match.positions == 8
    # The last prompt token is always computed: a prompt of exactly two blocks shares one.
    assert tier.match(prompt[:8]).positions == 4
    assert tier.match([5] + prompt).blocks == []


def test_shared_blocks_are_not_evicted_until_their_last_user_is_released() -> None:
    tier = _tier()
    prompt = list(range(200, 209))
    tier.released(1, prompt, list(range(1, 10)), list(range(1, 10)))
    match = tier.match(prompt + [1, 2])
    tier.admit(2, prompt + [1, 2], match)
    assert tier.evict(None) is None  # both blocks are shared by request 2
    # Request 2's own slots past the shared ones are freed; the shared ones stay cached.
    shared = [s for blk in match.blocks for s in blk.slots or []]
    free, _ = tier.released(2, prompt + [1, 2], shared + [30, 31, 32], list(range(11)))
    assert free == [30, 31, 32]
    # Unshared now: the extension goes first (a prefix outlives its extensions), host copy kept.
    evicted = tier.evict(None)
    assert evicted is not None and evicted[0] == list(range(5, 9))
    assert tier.stats.device_evictions == 1
    again = tier.match(prompt)
    assert [blk.slots is None for blk in again.blocks] == [False, True]
    assert again.shared == 4 and again.positions == 8  # one shared, one to load back
    # A match being admitted keeps its blocks: the first block is pinned, nothing else is left.
    assert tier.evict(again) is None


@pytest.mark.parametrize("deferred_free", [True, False])
def test_a_load_back_into_freed_slots_waits_for_the_step_that_freed_them(
    deferred_free: bool,
) -> None:
    tier = _tier()
    tier.deferred_free = deferred_free
    prompt = list(range(300, 309))
    tier.launched(5, tier.device.new_stream("x").record_event())
    tier.released(1, prompt, list(range(1, 10)), list(range(1, 10)))
    assert tier.evict(None) is not None and tier.evict(None) is not None
    assert tier.freed_at[1] == tier.freed_at[8] == 5
    match = tier.match(prompt)
    assert match.shared == 0 and match.positions == 8
    tier.load_back([(blk, [1, 2, 3, 4], [1, 2, 3, 4]) for blk in match.blocks[:1]])
    tier.issue(tier.device.new_stream("schedule"))
    st = tier.stats
    assert st.copies_checked == 2  # the write-through offload, then the load-back
    if deferred_free:  # one device wait orders both copies behind step 5's whole forward
        assert st.done_waits == 1 and st.unordered == []
    else:  # no fence was taken: neither copy is ordered behind step 5
        assert st.done_waits == 0
        assert [u.split()[0] for u in st.unordered] == ["offload", "load-back"]
