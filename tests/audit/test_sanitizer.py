"""The WAR sanitizer on the sim device: what it catches, what it passes, how it reports."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _support.audit import (
    TINY_MODEL,
    HiddenLateReader,
    OneElementLateReader,
    PeekingAlgorithm,
    UndeclaredHiddenReader,
)

from warcore import CONTRACT_MODES, ForwardMode, RecordPoint, SharedReadBoundary, cli
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit._poison import SharedBufferPoison
from warcore.audit.sanitizer import SanitizeReport, sanitize
from warcore.testing import DeclaredBackend, make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

SMALL: dict[str, Any] = {"requests": 3, "max_running": 2, "model": TINY_MODEL}
"""A tiny trace (three requests: prefill and decode), two graph buckets, a two-layer model."""


def _native(boundaries: dict[ForwardMode, SharedReadBoundary], **options: Any) -> SanitizeReport:
    plugin = DeclaredBackend(TorchNativeBackend, boundaries, follows_contract=CONTRACT_MODES)
    pm = make_plugin_manager(plugin, builtins="algorithms")
    return sanitize("torch_native", "none", pm=pm, **{**SMALL, **options})


def test_poison_is_a_valid_permutation_and_restores() -> None:
    table = torch.arange(40, dtype=torch.int64).view(4, 10) % 16
    original = table.clone()
    poison = SharedBufferPoison({"t": table, "alias": table[1:]}, modulus=16)
    assert poison.names == ("t",)  # matched by storage: one buffer, poisoned once
    poison.snapshot()
    poison.poison()
    poisoned = table.clone()
    assert bool((poisoned != original).all()), "every entry must change"
    assert int(poisoned.min()) >= 0 and int(poisoned.max()) < 16, "never out of range"
    assert sorted(set(poisoned.flatten().tolist())) == sorted(set(original.flatten().tolist()))
    poison.poison()  # idempotent: two record points in one step poison alike
    assert torch.equal(table, poisoned)
    poison.restore()
    assert torch.equal(table, original)


def test_the_contract_default_is_sound_and_every_publishing_forward_is_checked() -> None:
    report = _native({})
    assert report.sound, report.format()
    decode = next(m for m in report.modes if m.mode is ForwardMode.DECODE)
    prefill = next(m for m in report.modes if m.mode is ForwardMode.EXTEND)
    assert decode.record_points == {RecordPoint.IN_GRAPH_NODE: decode.forwards}
    assert decode.checked == decode.forwards > 0
    # torch_native's prefill publishes nothing: counted, never poisoned.
    assert prefill.record_points == {RecordPoint.NONE: prefill.forwards}
    assert prefill.checked == 0 < prefill.forwards
    assert report.checked == decode.forwards
    assert report.compared == report.forwards


def test_a_violation_names_backend_mode_algorithm_boundary_point_and_output() -> None:
    report = _native({ForwardMode.DECODE: SharedReadBoundary.PRE_REPLAY})
    assert not report.sound and report.error is None
    v = report.violation
    assert v is not None
    assert (v.backend, v.algorithm, v.forward_mode, v.kind) == (
        "torch_native",
        "none",
        ForwardMode.DECODE,
        "late-read",
    )
    assert v.declared is SharedReadBoundary.PRE_REPLAY
    assert v.declared_by == "plugin:DeclaredBackend"
    assert v.record_point is RecordPoint.PRE_REPLAY
    assert "token" in v.difference and "clean" in v.difference and "poisoned" in v.difference
    text = v.describe()
    for word in ("torch_native", "'none'", "DECODE", "PRE_REPLAY", "pre_replay"):
        assert word in text


@pytest.mark.parametrize("use_graphs", [True, False], ids=["graph", "eager"])
def test_one_late_read_of_one_element_of_one_row_is_caught(use_graphs: bool) -> None:
    # The contract (IN_REPLAY), declared (wrongly) for the graph; the eager path the same.
    eager = {ForwardMode.DECODE: SharedReadBoundary.IN_REPLAY}
    claim = DeclaredBackend(OneElementLateReader, {}, eager=eager, follows_contract=CONTRACT_MODES)
    pm = make_plugin_manager(claim)
    report = sanitize("wctest_one_element", "none", pm=pm, use_graphs=use_graphs, **SMALL)
    assert report.violation is not None, report.format()
    assert report.violation.forward_mode is ForwardMode.DECODE
    point = RecordPoint.IN_GRAPH_NODE if use_graphs else RecordPoint.AFTER_IN_GRAPH_INIT
    assert report.violation.record_point is point
    # Declared honestly, the same read is fine.
    honest = DeclaredBackend(
        OneElementLateReader, {ForwardMode.DECODE: SharedReadBoundary.POST_REPLAY}
    )
    pm = make_plugin_manager(honest)
    assert sanitize("wctest_one_element", "none", pm=pm, use_graphs=use_graphs, **SMALL).sound


@pytest.mark.parametrize("backend", [HiddenLateReader, UndeclaredHiddenReader])
def test_reads_outside_the_dispatcher_are_caught_declared_or_not(
    backend: type[TorchNativeBackend],
) -> None:
    """The sanitizer poisons memory, so it needs no declaration to see a read."""
    pm = make_plugin_manager(DeclaredBackend(backend, {}, follows_contract=CONTRACT_MODES))
    report = sanitize(backend.name, "none", pm=pm, **SMALL)
    assert report.violation is not None and report.violation.kind == "late-read"


SGLANG_RUNS = 10


def test_sglang_fallback_is_flagged_and_warcores_rule_is_sound() -> None:
    """torch_native's in-graph init reads req_to_token. A graph without a planted node:
    sglang #34052 recorded IN_REPLAY before the replay (flagged, every time); warcore records
    after the replay (sound, every time)."""
    pm = make_plugin_manager()
    flagged = sound = 0
    for _ in range(SGLANG_RUNS):
        legacy = sanitize("torch_native", pm=pm, plant_node=False, sglang_fallback=True, **SMALL)
        assert legacy.violation is not None, legacy.format()
        assert legacy.violation.record_point is RecordPoint.PRE_REPLAY
        assert legacy.violation.declared is SharedReadBoundary.IN_REPLAY
        flagged += 1
        rule = sanitize("torch_native", pm=pm, plant_node=False, **SMALL)
        decode = next(m for m in rule.modes if m.mode is ForwardMode.DECODE)
        assert decode.record_points.keys() == {RecordPoint.POST_REPLAY}
        assert rule.sound, rule.format()
        sound += 1
    assert (flagged, sound) == (SGLANG_RUNS, SGLANG_RUNS)


@pytest.mark.plugins("dflash")
def test_a_drafter_reading_after_the_verify_is_caught_in_its_own_step() -> None:
    """The step's read-done event covers everything after it in the step: the row state the
    step leaves is compared too, so a drafter's late read is caught where it happens."""
    algorithm = PeekingAlgorithm()
    pm = make_plugin_manager(algorithm)
    report = sanitize("wctest_peek_native", "wctest_peek", pm=pm, num_draft=2, **SMALL)
    v = report.violation
    assert v is not None, report.format()
    assert v.kind == "later-work"
    assert v.published_mode is ForwardMode.EXTEND or v.published_mode is ForwardMode.TARGET_VERIFY
    assert "drafts" in v.difference
    # The same backend with a drafter that reads nothing shared (dflash's) is sound.
    pm = make_plugin_manager(algorithm, entry_points=["dflash"])
    assert sanitize("wctest_peek_native", "dflash", pm=pm, num_draft=2, **SMALL).sound


@pytest.mark.plugin_agnostic
def test_cli_exit_status_and_rows(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sanitize", "--backend", "torch_native", "--algorithm", "none", "--requests", "3"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "torch_native  none" in out and "DECODE IN_REPLAY->in_graph_node" in out
    assert "all sound: 1 combination sanitized" in out
    assert cli.main([*args, "--no-plant-node", "--sglang-fallback"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION" in out and "DECODE IN_REPLAY->pre_replay" in out
    assert cli.main(["sanitize"]) == 2
    assert "--all" in capsys.readouterr().err
    assert cli.main(["sanitize", "--backend", "nope"]) == 2
    assert "valid: " in capsys.readouterr().err


@pytest.mark.installed  # every backend and algorithm installed
@pytest.mark.slow
def test_cli_all_is_sound_and_explains(capsys: pytest.CaptureFixture[str]) -> None:
    """What a fresh clone runs: every registered combination, sound, exit 0."""
    assert cli.main(["sanitize", "--all", "--requests", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("torch_native", "trtllm"))]
    assert any(row.startswith("torch_native") and " none " in row for row in rows)
    assert all(row.rstrip().endswith(("sound", "sound (nothing published)")) for row in rows)
    assert "all sound" in out and "VIOLATION" not in out
    assert cli.main(["sanitize", "--backend", "torch_native", "--explain", "--requests", "3"]) == 0
    out = capsys.readouterr().out
    assert "last shared read: in-graph init (TorchNativeBackend.gather_page_table)" in out
