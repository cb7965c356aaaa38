"""ngram's tests, written with warcore.testing: installed, its step declares the publish phase,
the drafter keeps the contract, the algorithm is lossless and sound, and it finds repetition.

The kit is an opt-in pytest plugin; this distribution enables it in its pyproject.toml
(``addopts = "-p warcore.testing"``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from warcore_ngram import ALGORITHM, STEP
from warcore_ngram.drafter import PromptLookupDrafter, RowIndex, lookup

from warcore import ForwardMode
from warcore.core import (
    WarcorePluginManager,
    get_registry,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from warcore.engine.drafter import Drafter, DraftInput
from warcore.testing import DeclaredAlgorithm, assert_declarations_sound, assert_matches_serial


@pytest.mark.warcore_plugins("ngram")
def test_the_plugin_is_installed_and_its_step_declares_the_publish_phase(
    warcore_pm: WarcorePluginManager,
) -> None:
    assert get_registry(warcore_pm).algorithm(ALGORITHM).step is STEP
    # No hook answers for ngram: the core answers from the step, once, with provenance.
    for mode in ForwardMode:
        answer = resolve_war_publish_phase(ALGORITHM, mode, pm=warcore_pm)
        publishes = mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)
        assert (answer.publishes, answer.source) == (publishes, "step:ngram")
    owner = resolve_step_event_owner(ALGORITHM, pm=warcore_pm)
    assert (owner.owner, owner.source) == ("target", "step:ngram")


def test_lookup_continues_the_latest_earlier_occurrence() -> None:
    index = RowIndex(request_id=0)
    index.extend([5, 6, 7, 8, 5, 6], max_n=3)
    # The suffix (5, 6) occurred at the start, followed by 7, 8, 5, 6, ...
    assert lookup(index, 4, max_n=3, min_n=1) == [7, 8, 5, 6]
    index.extend([5, 6, 7, 9], max_n=3)  # prefix kept, two new tokens
    # The suffix (6, 7, 9) never occurred; (7, 9) neither; 9 neither: repeat the last token.
    assert lookup(index, 3, max_n=3, min_n=1) == [9, 9, 9]
    index.extend([5, 6, 7, 9, 1, 2, 7], max_n=3)  # not an extension: the index starts over
    # The longest suffix seen earlier is (7,): its occurrence was followed by 9, 1, 2, 7, ...
    assert lookup(index, 5, max_n=3, min_n=1) == [9, 1, 2, 7, 9]


def test_the_drafter_follows_the_contract() -> None:
    drafter = PromptLookupDrafter(4)
    assert isinstance(drafter, Drafter)
    assert drafter.location == "host"  # it reads batch.committed: a sync per step on CUDA


class RecordingDrafter(PromptLookupDrafter):
    """Checks, as the engine calls it, what the contract promises."""

    def __init__(self, num_draft: int) -> None:
        super().__init__(num_draft)
        self.calls: list[tuple[str, int, int]] = []
        self.live: dict[int, int] = {}
        self.prompts: dict[int, list[int]] = {}

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        assert row not in self.live, f"row {row} admitted twice without a release"
        self.live[row] = request_id
        self.prompts[request_id] = list(prompt)
        self.calls.append(("admit", row, request_id))
        super().admit(row, request_id, prompt)

    def release(self, row: int) -> None:
        assert row in self.live, f"row {row} released but never admitted"
        self.calls.append(("release", row, self.live.pop(row)))
        super().release(row)

    def propose(self, batch: DraftInput) -> None:
        assert batch.committed is not None and batch.num_draft == self.num_draft
        assert batch.mode in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY)
        for row, rid, tokens in zip(batch.row_ids, batch.request_ids, batch.committed, strict=True):
            assert self.live.get(row) == rid, f"row {row}: request {rid} was not admitted there"
            prompt = self.prompts[rid]
            assert tokens[: len(prompt)] == prompt  # the prompt, then the accepted output
            assert len(tokens) > len(prompt)  # at least the first sampled token
        self.calls.append(("propose", len(batch.row_ids), 0))
        super().propose(batch)


def test_the_engine_admits_proposes_and_releases_in_order(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    made: list[RecordingDrafter] = []

    def factory(target: Any, num_draft: int, device: Any) -> RecordingDrafter:
        made.append(RecordingDrafter(num_draft))
        return made[-1]

    pm = make_warcore_pm(DeclaredAlgorithm("ngram_checked", STEP, drafter=factory))
    report = assert_matches_serial("ngram_checked", pm=pm, requests=20, prompts="repetitive")
    assert report.rows_reused > 0  # rows were handed from one request to the next
    (drafter,) = made
    admitted = [c for c in drafter.calls if c[0] == "admit"]
    released = [c for c in drafter.calls if c[0] == "release"]
    assert len(admitted) == 20 and sorted(c[2] for c in released) == list(range(20))
    assert drafter.live == {}  # every row released by the end of the run


@pytest.mark.warcore_plugins("ngram")
@pytest.mark.parametrize("prompts", ["random", "repetitive"])
def test_ngram_is_lossless(warcore_pm: WarcorePluginManager, prompts: str) -> None:
    assert_matches_serial(ALGORITHM, pm=warcore_pm, requests=24, prompts=prompts)


@pytest.mark.warcore_plugins("ngram")
def test_ngram_declarations_are_sound(warcore_pm: WarcorePluginManager) -> None:
    """The conformance check: ngram under every backend the core offers."""
    reports = assert_declarations_sound(algorithm=ALGORITHM, pm=warcore_pm)
    assert "torch_native" in {r.backend for r in reports}
    assert all(r.checked > 0 for r in reports)  # verifies ran with poisoned buffers


@pytest.mark.skipif(
    importlib.util.find_spec("warcore_dflash") is None, reason="the dflash plugin is not installed"
)
@pytest.mark.warcore_plugins("ngram", "dflash")
def test_ngram_accepts_more_than_dflash_on_repetitive_prompts(
    warcore_pm: WarcorePluginManager,
) -> None:
    """The reference model's weights are random: no drafter predicts it in general, but its
    greedy output falls into cycles, which prompt lookup finds and a block drafter does not."""
    accepted = {
        algorithm: assert_matches_serial(
            algorithm, pm=warcore_pm, requests=32, prompts="repetitive"
        ).mean_accepted
        for algorithm in (ALGORITHM, "dflash")
    }
    assert accepted[ALGORITHM] > accepted["dflash"] + 0.1, accepted
