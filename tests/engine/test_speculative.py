"""Speculative decoding on the sim device: lossless under the overlap loop and the fine fence,
published where each algorithm's last shared read is, and the deepseek_v4 verify race."""

from __future__ import annotations

import random
from functools import cache

import pytest
import torch
from _support import fresh_manager
from _support.engine import deepseek_verify_manager

import warcore
from warcore import ForwardMode, RecordPoint, SharedReadBoundary
from warcore.batch import RowState
from warcore.engine import Engine, EngineConfig, Request, RunReport, synthetic_trace

pytestmark = pytest.mark.plugins()

TRACE = synthetic_trace(32, seed=21, output_len=(2, 24))


def run(config: EngineConfig, requests: list[Request] = TRACE, **kw: object) -> RunReport:
    with Engine(config, device="sim", **kw) as engine:  # type: ignore[arg-type]
        return engine.run(requests)


@cache
def plain_greedy() -> dict[int, list[int]]:
    """The oracle: plain serial greedy decoding, no speculation."""
    return run(EngineConfig(loop="serial")).outputs


COMBINATIONS = [
    ("eagle", "torch_native"),
    ("eagle", "trtllm_mha"),
    ("dflash", "torch_native"),
    ("dflash", "trtllm_mha"),
    ("dflash", "deepseek_v4"),
    ("dspark", "deepseek_v4"),
    ("dspark", "torch_native"),
]


@pytest.mark.parametrize(("algorithm", "backend"), COMBINATIONS)
@pytest.mark.slow
def test_overlap_fine_fence_is_lossless(algorithm: str, backend: str) -> None:
    report = run(EngineConfig(backend=backend, algorithm=algorithm))
    assert report.verifies > 0
    assert report.rows_reused > 5
    assert report.outputs == plain_greedy()


def _points(report: RunReport, mode: ForwardMode) -> set[RecordPoint]:
    return {point for (m, point), n in report.published.items() if m is mode and n}


@pytest.mark.parametrize(
    ("algorithm", "backend", "verify", "draft_extend"),
    [
        ("dflash", "torch_native", RecordPoint.IN_GRAPH_NODE, None),
        ("dflash", "deepseek_v4", RecordPoint.POST_REPLAY, None),
        ("dspark", "deepseek_v4", RecordPoint.IN_GRAPH_NODE, None),
        ("eagle", "torch_native", RecordPoint.NONE, RecordPoint.IN_GRAPH_NODE),
        ("eagle", "trtllm_mha", RecordPoint.NONE, RecordPoint.IN_GRAPH_NODE),
    ],
)
def test_each_step_publishes_at_its_last_shared_read(
    algorithm: str, backend: str, verify: RecordPoint, draft_extend: RecordPoint | None
) -> None:
    report = run(EngineConfig(backend=backend, algorithm=algorithm))
    assert _points(report, ForwardMode.TARGET_VERIFY) == {verify}
    verifies = report.forwards[ForwardMode.TARGET_VERIFY]
    if draft_extend is None:
        assert not _points(report, ForwardMode.DRAFT_EXTEND_V2)
        assert report.barriers["fine"] >= verifies  # every verify step fenced finely
    else:
        assert _points(report, ForwardMode.DRAFT_EXTEND_V2) == {draft_extend}
        # The drafter's k decode steps per verify never publish: draft-extend reads later.
        assert _points(report, ForwardMode.DECODE) == {RecordPoint.NONE}
        assert report.published[(ForwardMode.DECODE, RecordPoint.NONE)] == 4 * verifies
        # ... and each prefill step whose draft reads the stager staged is fenced finely too.
        assert report.barriers["fine"] == verifies + report.staged_prefills
        staged = backend == "trtllm_mha"  # its prefill is PRE_REPLAY; torch_native's UNKNOWN
        assert (report.staged_prefills > 0) == staged


@pytest.mark.slow
def test_eagle_with_the_nccl_flag_records_draft_extend_after_replay() -> None:
    flags = (("nccl_allgather_in_overlap", True),)
    report = run(EngineConfig(backend="trtllm_mha", algorithm="eagle", flags=flags))
    assert _points(report, ForwardMode.DRAFT_EXTEND_V2) == {RecordPoint.POST_REPLAY}
    assert report.outputs == plain_greedy()


# -- acceptance: a drafter that knows the answer, mostly --------------------------------


class OracleDrafter:
    """Proposes each row's true continuation, corrupting some drafts: exercises partial
    acceptance, over-allocation and early finishes, which random weights rarely reach."""

    def __init__(self, sequences: list[list[int]], num_draft: int, corrupt: float) -> None:
        self.sequences = sequences
        self.num_draft = num_draft
        self.corrupt = corrupt
        self.rng = random.Random(0)

    def propose(self, rows: torch.Tensor, state: RowState) -> None:
        k = self.num_draft
        for row, pos, token in zip(
            rows.tolist(), state.kv_len[rows].tolist(), state.token[rows].tolist(), strict=True
        ):
            guess = next(
                (
                    s[pos + 1 : pos + 1 + k]
                    for s in self.sequences
                    if len(s) > pos and s[pos] == token
                ),
                [],
            )
            guess = (guess + [0] * k)[:k]
            drafts = [t if self.rng.random() > self.corrupt else (t + 1) % 512 for t in guess]
            state.drafts[row, :k] = torch.tensor(drafts)


class OraclePlugin:
    def __init__(self, sequences: list[list[int]], corrupt: float) -> None:
        self.sequences, self.corrupt = sequences, corrupt

    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> list[warcore.AlgorithmSpec]:
        def make(target: object, num_draft: int, device: object) -> OracleDrafter:
            return OracleDrafter(self.sequences, num_draft, self.corrupt)

        return [warcore.AlgorithmSpec("wctest_oracle", "dflash", "test drafter", drafter=make)]

    @warcore.hookimpl
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        if algorithm != "wctest_oracle":
            return None
        return forward_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)


@pytest.mark.parametrize("backend", ["trtllm_mha", "deepseek_v4"])
@pytest.mark.parametrize("loop", ["overlap", "serial"])
def test_high_acceptance_is_still_lossless(backend: str, loop: str) -> None:
    expected = plain_greedy()
    sequences = [r.prompt + expected[r.rid] for r in TRACE]
    pm = fresh_manager(OraclePlugin(sequences, corrupt=0.2))
    report = run(
        EngineConfig(backend=backend, algorithm="wctest_oracle", loop=loop),  # type: ignore[arg-type]
        pm=pm,
    )
    assert report.mean_accepted > 1.5
    assert report.outputs == expected


# -- the deepseek_v4 verify race ---------------------------------------------------------


RACE_TRACE = synthetic_trace(32, seed=4, output_len=(2, 10))


@pytest.mark.parametrize("early", [SharedReadBoundary.IN_REPLAY, SharedReadBoundary.PRE_REPLAY])
@pytest.mark.slow
def test_deepseek_verify_declared_early_corrupts_tokens(early: SharedReadBoundary) -> None:
    expected = run(EngineConfig(loop="serial"), RACE_TRACE).outputs
    config = EngineConfig(backend="deepseek_v4", algorithm="dflash")
    pm = deepseek_verify_manager(early)
    corrupted = False
    for _ in range(5):
        report = run(config, RACE_TRACE, pm=pm)
        assert _points(report, ForwardMode.TARGET_VERIFY) == {
            RecordPoint.IN_GRAPH_NODE
            if early is SharedReadBoundary.IN_REPLAY
            else RecordPoint.PRE_REPLAY
        }
        if report.outputs != expected:
            corrupted = True
            break
    assert corrupted, f"declaring deepseek_v4 verify {early.name} never corrupted a token"


@pytest.mark.slow
def test_deepseek_verify_post_replay_never_corrupts() -> None:
    expected = run(EngineConfig(loop="serial"), RACE_TRACE).outputs
    config = EngineConfig(backend="deepseek_v4", algorithm="dflash")
    pm = deepseek_verify_manager(SharedReadBoundary.POST_REPLAY)
    for _ in range(5):
        report = run(config, RACE_TRACE, pm=pm)
        assert _points(report, ForwardMode.TARGET_VERIFY) == {RecordPoint.POST_REPLAY}
        assert report.outputs == expected


def test_a_verify_launched_after_the_request_already_finished_stays_in_its_slots() -> None:
    """Found by the soak: with the overlap loop a verify may be launched before the host learns
    that the previous one finished the request with tokens to spare; its positions then run
    past max_new_tokens. They must stay inside the request's reserved slots, or they write
    K/V into slots of other requests through stale row entries."""
    trace = synthetic_trace(48, seed=5, output_len=(3, 14), mean_gap_steps=0.3)
    expected = run(EngineConfig(loop="serial"), trace).outputs
    sequences = [r.prompt + expected[r.rid] for r in trace]
    pm = fresh_manager(OraclePlugin(sequences, corrupt=0.1))
    with Engine(
        EngineConfig(backend="trtllm_mha", algorithm="wctest_oracle"), device="sim", pm=pm
    ) as e:
        for _ in range(3):
            report = e.run(trace)
            assert report.mean_accepted > 2
            assert report.outputs == expected
