"""The words the docs give are the words the tools print: the sanitizer's verdicts, and the read
tracer's note beside a violation, which never contradicts the verdict."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from _support import ROOT
from _support.audit import TINY_MODEL, PeekingAlgorithm

import warcore
from warcore import AlgorithmSpec, ForwardMode, Phase, SharedReadBoundary, StepSpec, cli
from warcore.audit.sanitizer import VIOLATION_KINDS, sanitize
from warcore.audit.tracer import trace_reads, violation_note
from warcore.batch import RowState
from warcore.testing import (
    DeclaredAlgorithm,
    assert_declarations_sound,
    make_plugin_manager,
)

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

SMALL: dict[str, Any] = {"requests": 3, "max_running": 2, "model": TINY_MODEL}
VERDICTS_PAGE = ROOT / "docs" / "plugins" / "algorithm.md"
"""The docs page whose table of verdicts plugin authors read."""


def _documented_verdicts() -> list[str]:
    """The first column of the docs page's table whose header is ``| verdict | ...``."""
    lines = VERDICTS_PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| verdict |"))
    names = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names.append(re.fullmatch(r"`([a-z-]+)`", line.split("|")[1].strip()).group(1))  # type: ignore[union-attr]
    return names


def test_the_docs_name_exactly_the_sanitizers_verdicts() -> None:
    assert sorted(_documented_verdicts()) == sorted(VIOLATION_KINDS)


def _early_owner() -> DeclaredAlgorithm:
    """k draft decodes then a verify, the last draft decode declared the last reader: one
    phase too early (the verify after it reads the shared buffers: ``later-forward``)."""
    step = StepSpec(
        prefill=(Phase("target", ForwardMode.EXTEND), Phase("draft", ForwardMode.DRAFT_EXTEND)),
        decode=(
            Phase("draft", ForwardMode.DECODE, repeat="num_draft", last_reader=True),
            Phase("target", ForwardMode.TARGET_VERIFY),
        ),
    )
    return DeclaredAlgorithm("wctest_early_owner", step, drafter=lambda target, k, dev: target)


def _violation(kind: str) -> Any:
    if kind == "late-read":
        pm = make_plugin_manager()
        return sanitize(
            "torch_native", "none", pm=pm, plant_node=False, sglang_fallback=True, **SMALL
        )
    if kind == "later-forward":
        pm = make_plugin_manager(_early_owner())
        return sanitize("torch_native", "wctest_early_owner", pm=pm, **SMALL)
    assert kind == "later-work"
    pm = make_plugin_manager(PeekingAlgorithm())
    return sanitize("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, **SMALL)


@pytest.mark.parametrize("kind", ["late-read", "later-forward", "later-work"])
def test_a_real_violation_prints_its_documented_verdict(kind: str) -> None:
    report = _violation(kind)
    assert report.violation is not None and report.violation.kind == kind, report.format()
    assert kind in _documented_verdicts()
    assert f"VIOLATION ({kind})" in report.violation.describe()  # was: "VIOLATION backend ..."
    assert report.verdict == f"VIOLATION ({kind})"
    assert f"VIOLATION ({kind})" in report.format()


@pytest.mark.plugin_agnostic
def test_the_cli_table_and_message_carry_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sanitize", "--backend", "torch_native", "--algorithm", "none", "--requests", "3"]
    assert cli.main([*args, "--no-plant-node", "--sglang-fallback"]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("torch_native "))
    assert row.rstrip().endswith("VIOLATION (late-read)")
    assert "VIOLATION (late-read) backend 'torch_native'" in out


def test_a_plugin_authors_match_on_the_documented_word_works() -> None:
    pm = make_plugin_manager(PeekingAlgorithm())
    with pytest.raises(AssertionError, match="later-work"):
        assert_declarations_sound("wctest_peek_native", "wctest_peek", pm=pm, **SMALL)


# -- the tracer's note beside a drafter's late read -----------------------------------------


@pytest.mark.plugins("dflash")
def test_the_tracer_sees_the_drafters_read_after_the_forwards() -> None:
    pm = make_plugin_manager(PeekingAlgorithm())
    trace = trace_reads("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, model=TINY_MODEL)
    verify = trace.mode(ForwardMode.TARGET_VERIFY)
    assert verify.last is not None and verify.last.after_forward, verify.summary()
    assert verify.last.label == "draft_propose" and verify.last.buffer == "req_to_token"
    assert verify.implied is SharedReadBoundary.UNKNOWN  # no record point is late enough
    assert "drafter propose, after the forward" in verify.summary()
    # dflash's own drafter reads nothing shared: its verify still allows IN_REPLAY.
    plain = trace_reads("torch_native", "dflash", model=TINY_MODEL, num_draft=2)
    assert plain.mode(ForwardMode.TARGET_VERIFY).implied is SharedReadBoundary.IN_REPLAY


def test_the_note_beside_a_later_work_violation_agrees_with_it() -> None:
    pm = make_plugin_manager(PeekingAlgorithm())
    with pytest.raises(AssertionError) as info:
        assert_declarations_sound("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, **SMALL)
    message = str(info.value)
    assert "VIOLATION (later-work)" in message
    note = message[message.index("read tracer,") :]
    assert "the reads allow IN_REPLAY" not in note  # was: contradicting the verdict
    assert "work after the forward reads shared buffers" in note
    assert "no record point in the forward is late enough" in note


class BlindPeekingAlgorithm(PeekingAlgorithm):
    """The same late read, through numpy: outside torch's dispatcher, and undeclared."""

    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        def drafter(target: Any, num_draft: int, device: Any) -> NumpyPeekingDrafter:
            return NumpyPeekingDrafter(self.pool.req_to_token, num_draft, target.cfg.vocab_size)

        return [AlgorithmSpec("wctest_peek", "dflash", "drafts from the page table", drafter)]


class NumpyPeekingDrafter:
    def __init__(self, table: torch.Tensor, num_draft: int, vocab: int) -> None:
        self.table, self.num_draft, self.vocab = table, num_draft, vocab

    def propose(self, rows: torch.Tensor, state: RowState) -> None:
        k = self.num_draft
        slots = self.table.numpy()[rows.numpy(), :k] % self.vocab  # unseen by the tracer
        state.drafts[rows, :k] = torch.from_numpy(slots)


def test_the_note_says_when_the_tracer_cannot_see_the_read() -> None:
    pm = make_plugin_manager(BlindPeekingAlgorithm())
    report = sanitize("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, **SMALL)
    assert report.violation is not None and report.violation.kind == "later-work"
    trace = trace_reads("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, model=TINY_MODEL)
    note = violation_note(trace, report.violation)
    assert "the reads allow IN_REPLAY" not in note
    assert "the tracer saw no shared read in the work after the forwards" in note
    assert "declare_shared_read" in note
