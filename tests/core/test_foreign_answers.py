"""Answers for another plugin's algorithm.

``wctest_definer`` defines the algorithm ``wctest_spec`` by its step alone (EAGLE's shape:
the draft-extend after the verify is the last reader, on the draft runner) and answers no
hook. ``wctest_intruder``, a third-party plugin, answers the publish phase and the event owner
for it. Such an answer never overrides the algorithm's own: where it agrees with the step it
stands, where it disagrees it is a conflict, resolved to the safe side (publish nothing; no
owner: the coarse barrier), and ``warcore check`` names both plugins.
"""

from __future__ import annotations

from typing import Any

import pytest

from warcore import (
    BoundaryContext,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    StepFacts,
    hookimpl,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from warcore.audit.matrix import find_problems
from warcore.core import WarcorePluginManager, decide
from warcore.engine.steps import EAGLE_STEP
from warcore.testing import DeclaredAlgorithm, make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

M = ForwardMode
ALGORITHM = "wctest_spec"
DEFINER, INTRUDER = "wctest_definer", "wctest_intruder"


class Intruder:
    """Answers for ``wctest_spec``, which it does not define."""

    def __init__(self, publishes: dict[ForwardMode, bool], owner: str | None) -> None:
        self.publishes, self.owner = publishes, owner

    @hookimpl
    def warcore_is_war_publish_phase(self, algorithm: str, forward_mode: ForwardMode) -> Any:
        return self.publishes.get(forward_mode) if algorithm == ALGORITHM else None

    @hookimpl
    def warcore_step_event_owner(self, algorithm: str) -> str | None:
        return self.owner if algorithm == ALGORITHM else None


def _manager(intruder: Intruder | None) -> WarcorePluginManager:
    pm = make_plugin_manager()
    definer = DeclaredAlgorithm(ALGORITHM, EAGLE_STEP, drafter=lambda *args: None)
    pm.register(definer, name=DEFINER)
    if intruder is not None:
        pm.register(intruder, name=INTRUDER)
    return pm


def test_without_an_intruder_the_step_answers() -> None:
    pm = _manager(None)
    for mode in (M.TARGET_VERIFY, M.DRAFT_EXTEND_V2):
        answer = resolve_war_publish_phase(ALGORITHM, mode, pm=pm)
        assert (answer.publishes, answer.source) == (mode is M.DRAFT_EXTEND_V2, f"step:{DEFINER}")
    owner = resolve_step_event_owner(ALGORITHM, StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == ("draft", f"step:{DEFINER}")


@pytest.mark.parametrize(
    ("mode", "claim"),
    [
        (M.TARGET_VERIFY, True),  # the verify is not the last reader: publishing there is unsafe
        (M.DRAFT_EXTEND_V2, False),  # the last reader, denied: safe, and still a conflict
    ],
)
def test_a_publish_phase_answer_that_contradicts_the_step_is_a_conflict(
    mode: ForwardMode, claim: bool
) -> None:
    pm = _manager(Intruder({mode: claim}, None))
    answer = resolve_war_publish_phase(ALGORITHM, mode, pm=pm)
    assert (answer.publishes, answer.source) == (False, "default:conflict")
    assert dict(answer.answers) == {INTRUDER: claim, f"step:{DEFINER}": not claim}
    kind = RunnerKind.DECODE if mode is M.TARGET_VERIFY else RunnerKind.DRAFT_EXTEND
    d = decide(pm, kind, "torch_native", mode, BoundaryContext(ALGORITHM), Execution.GRAPH_PLANTED)
    assert (d.record_point, d.source) == (RecordPoint.NONE, "phase:default:conflict")
    problems = [p for p in find_problems(pm) if ALGORITHM in p]  # said once, naming both
    assert len(problems) == 1 and mode.name in problems[0], problems
    assert INTRUDER in problems[0] and DEFINER in problems[0], problems


def test_a_publish_phase_answer_that_agrees_with_the_step_stands() -> None:
    pm = _manager(Intruder({M.DRAFT_EXTEND_V2: True, M.TARGET_VERIFY: False}, None))
    for mode in (M.TARGET_VERIFY, M.DRAFT_EXTEND_V2):
        answer = resolve_war_publish_phase(ALGORITHM, mode, pm=pm)
        assert (answer.publishes, answer.source) == (
            mode is M.DRAFT_EXTEND_V2,
            f"plugin:{INTRUDER}",
        )
    assert not [p for p in find_problems(pm) if ALGORITHM in p]


def test_an_event_owner_that_contradicts_the_step_means_no_owner() -> None:
    pm = _manager(Intruder({}, "target"))
    owner = resolve_step_event_owner(ALGORITHM, StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == (None, "default:conflict")
    assert dict(owner.answers) == {INTRUDER: "target", f"step:{DEFINER}": "draft"}
    problems = [p for p in find_problems(pm) if ALGORITHM in p]  # said once, naming both
    assert len(problems) == 1 and "owner" in problems[0], problems
    assert INTRUDER in problems[0] and DEFINER in problems[0], problems
    # Agreeing with the step, it stands.
    pm = _manager(Intruder({}, "draft"))
    owner = resolve_step_event_owner(ALGORITHM, StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == ("draft", f"plugin:{INTRUDER}")


def test_an_algorithms_own_hook_still_answers_for_itself() -> None:
    """The core defines ``eagle`` and answers its hooks itself: a plugin agreeing with it (as
    warcore-sglang does for ``none``) adds itself to the provenance, as before."""
    pm = make_plugin_manager(Intruder({}, None))
    owner = resolve_step_event_owner("eagle", StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == ("draft", "plugin:warcore")


def test_step_problems_names_a_third_party_contradicting_the_step() -> None:
    """``check``'s step audit (issue 14) reported only the defining plugin's own hooks; a third
    party's contradicting answer (a conflict, so the coarse fence) is reported too, naming it."""
    from warcore.audit.steps import step_problems

    pm = _manager(Intruder({M.TARGET_VERIFY: True}, "target"))
    problems = step_problems(pm)
    [publish] = [p for p in problems if "warcore_is_war_publish_phase" in p]
    assert f"algorithm {ALGORITHM!r}" in publish and "says TARGET_VERIFY is not" in publish
    assert f"answers True (plugin:{INTRUDER})" in publish and "a conflict" in publish, publish
    [owner] = [p for p in problems if "warcore_step_event_owner" in p]
    assert f"answers 'target' (plugin:{INTRUDER})" in owner and "a conflict" in owner, owner
    assert len(problems) == 2, problems
    # ``check`` says each conflict once: the matrix leaves out what the step audit said.
    assert sorted(p for p in find_problems(pm) if ALGORITHM in p) == sorted(problems)
    # Agreeing with the step, nothing to report.
    assert step_problems(_manager(Intruder({M.DRAFT_EXTEND_V2: True}, "draft"))) == []
