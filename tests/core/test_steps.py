"""Steps as data: an algorithm describes its step; the engine runs any such step,
the sanitizer audits it, ``check`` reports what cannot run or contradicts its hooks."""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable, Iterable
from typing import Any

import pytest

import warcore
from warcore import AlgorithmSpec, ForwardMode, Phase, StepSpec
from warcore.audit.sanitizer import combinations, sanitize
from warcore.audit.steps import step_problems
from warcore.cli import main
from warcore.core import (
    StepFacts,
    WarcorePluginManager,
    get_registry,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from warcore.engine import Engine, EngineConfig
from warcore.engine.steps import DFLASH_STEP, EAGLE_STEP, NONE_STEP, engine_problem
from warcore.testing import DeclaredAlgorithm, assert_declarations_sound, assert_matches_serial

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

EXTEND, DECODE, VERIFY = ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY


def k_draft_verify(*, early: bool = False) -> StepSpec:
    """None of the built-in shapes: k draft-model decode steps, then one target verify, and no
    draft-extend, so the verify is the last reader (the target owns the event). ``early``
    declares the last draft decode the last reader instead: one phase too early."""
    return StepSpec(
        prefill=(Phase("target", EXTEND), Phase("draft", ForwardMode.DRAFT_EXTEND)),
        decode=(
            Phase("draft", DECODE, repeat="num_draft", last_reader=early),
            Phase("target", VERIFY),
        ),
    )


def self_draft(target: Any, num_draft: int, device: Any) -> Any:
    """The draft model is the target itself (its own KV pool): drafts are usually accepted."""
    return target


def kdv_plugin(*, early: bool = False) -> DeclaredAlgorithm:
    return DeclaredAlgorithm(
        "wctest_k_draft_verify", k_draft_verify(early=early), drafter=self_draft
    )


# -- the vocabulary --------------------------------------------------------------------------


def test_the_built_in_families_are_steps() -> None:
    assert (NONE_STEP.owner, NONE_STEP.publish_modes) == ("target", {DECODE, EXTEND})
    assert (DFLASH_STEP.owner, DFLASH_STEP.publish_modes) == ("target", {VERIFY, EXTEND})
    assert DFLASH_STEP.propose and not DFLASH_STEP.has_draft_model
    assert (EAGLE_STEP.owner, EAGLE_STEP.publish_modes) == (
        "draft",
        {ForwardMode.DRAFT_EXTEND_V2},
    )
    step = k_draft_verify()
    assert (step.owner, step.publish_modes, step.has_draft_model) == ("target", {VERIFY}, True)
    early = k_draft_verify(early=True)
    assert (early.owner, early.publish_modes) == ("draft", {DECODE})
    assert "draft DECODE xnum_draft* -> target TARGET_VERIFY" in early.describe()


def test_a_malformed_step_is_refused_naming_the_algorithm_and_the_problem() -> None:
    two = StepSpec(decode=(Phase("target", VERIFY, last_reader=True),) * 2)
    with pytest.raises(
        ValueError, match="AlgorithmSpec 'wctest_mine': step decode flags more than one"
    ):
        AlgorithmSpec("wctest_mine", "wctest_mine", step=two)
    replaced = StepSpec(
        decode=(Phase("draft", DECODE, last_reader=True), Phase("draft", ForwardMode.IDLE))
    )
    with pytest.raises(
        ValueError, match="'wctest_mine': step decode: the last reader draft DECODE"
    ):
        AlgorithmSpec("wctest_mine", "wctest_mine", step=replaced)
    with pytest.raises(ValueError, match="'wctest_mine': step decode has no phase"):
        AlgorithmSpec("wctest_mine", "wctest_mine", step=StepSpec(decode=()))
    with pytest.raises(TypeError, match="'wctest_mine': step must be a warcore.StepSpec"):
        AlgorithmSpec("wctest_mine", "wctest_mine", step="verify")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runner must be 'target' or 'draft'"):
        Phase("drafter", DECODE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeat must be an int >= 1 or 'num_draft'"):
        Phase("draft", DECODE, repeat=0)
    assert Phase("target", "TARGET_VERIFY").mode is VERIFY  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            AlgorithmSpec("wctest_x", "wctest_medusa"),
            "family 'wctest_medusa' is none of the built-in step shapes",
        ),
        (
            AlgorithmSpec(
                "wctest_x", "wctest_x", step=StepSpec(decode=(Phase("target", ForwardMode.MIXED),))
            ),
            "the target runs TARGET_VERIFY (with drafts) or DECODE",
        ),
        (
            AlgorithmSpec("wctest_x", "wctest_x", step=StepSpec(decode=(Phase("target", VERIFY),))),
            "its verify needs exactly one source of drafts",
        ),
        (
            AlgorithmSpec("wctest_x", "wctest_x", step=DFLASH_STEP),
            "its step needs a drafter that proposes, but its AlgorithmSpec has no drafter",
        ),
        (
            AlgorithmSpec(
                "wctest_x",
                "wctest_x",
                step=StepSpec(
                    decode=(Phase("target", VERIFY),), propose=True, acceptance="typical"
                ),
            ),
            "acceptance 'typical': the reference engine accepts greedy_prefix only",
        ),  # fmt: skip
    ],
)
def test_engine_problem_says_why_a_step_cannot_run(spec: AlgorithmSpec, problem: str) -> None:
    why = engine_problem(spec)
    assert why is not None and problem in why
    runnable = AlgorithmSpec("wctest_x", "wctest_x", drafter=self_draft, step=k_draft_verify())
    assert engine_problem(runnable) is None


# -- resolution: the step answers when no hook does ------------------------------------------


@pytest.mark.plugin_agnostic
def test_a_step_answers_the_publish_phase_and_owner_when_no_plugin_does(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    plugin = kdv_plugin()
    pm = make_warcore_pm(plugin)
    source = f"step:{plugin.__name__}"
    verify = resolve_war_publish_phase("wctest_k_draft_verify", VERIFY, pm=pm)
    assert (verify.publishes, verify.source) == (True, source)
    for mode in (EXTEND, DECODE, ForwardMode.DRAFT_EXTEND):
        answer = resolve_war_publish_phase("wctest_k_draft_verify", mode, pm=pm)
        assert (answer.publishes, answer.source) == (False, source)
    owner = resolve_step_event_owner("wctest_k_draft_verify", StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == ("target", source)
    early = make_warcore_pm(kdv_plugin(early=True))
    assert resolve_step_event_owner("wctest_k_draft_verify", pm=early).owner == "draft"
    assert resolve_war_publish_phase("wctest_k_draft_verify", DECODE, pm=early).publishes
    # The built-ins keep answering through their hooks, which agree with their steps.
    assert resolve_war_publish_phase("eagle", ForwardMode.DRAFT_EXTEND_V2).source.startswith(
        "plugin:"
    )


class ContradictingHooks(DeclaredAlgorithm):
    """k_draft_verify's own plugin, whose hooks say its draft decodes are the last reader; its
    step says not. (Another plugin's answer is a conflict instead:
    tests/core/test_foreign_answers.py.)
    """

    def __init__(self) -> None:
        super().__init__("wctest_k_draft_verify", k_draft_verify(), drafter=self_draft)
        self.__name__ = "ContradictingHooks"

    @warcore.hookimpl
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        return forward_mode is DECODE if algorithm == "wctest_k_draft_verify" else None

    @warcore.hookimpl
    def warcore_step_event_owner(self, algorithm: str, facts: StepFacts) -> str | None:
        return "draft" if algorithm == "wctest_k_draft_verify" else None


class OtherShapes:
    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        return [
            AlgorithmSpec("wctest_medusa", "wctest_medusa", "a family the engine does not know"),
            AlgorithmSpec("wctest_dflash_no_drafter", "dflash", "a built-in shape, no drafter"),
        ]


@pytest.mark.installed
def test_check_reports_unrunnable_algorithms_and_hooks_contradicting_steps(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    assert step_problems(make_warcore_pm(kdv_plugin())) == []
    if "dflash" in {ep.name for ep in md.entry_points(group="warcore")}:
        assert step_problems(make_warcore_pm(entry_points=["dflash"])) == []
    pm = make_warcore_pm(ContradictingHooks(), OtherShapes())
    problems = "\n".join(step_problems(pm))
    assert "algorithm 'wctest_medusa' (plugin 'OtherShapes') is not runnable" in problems
    assert "family 'wctest_medusa' is none of the built-in step shapes" in problems
    assert "'wctest_dflash_no_drafter' (plugin 'OtherShapes') is not runnable" in problems
    assert (
        "algorithm 'wctest_k_draft_verify': its step (plugin 'ContradictingHooks': prefill: "
        "target EXTEND -> draft "
        "DRAFT_EXTEND*; decode: draft DECODE xnum_draft -> target TARGET_VERIFY*) says DECODE "
        "is not its last shared reader, but warcore_is_war_publish_phase answers True "
        "(plugin:ContradictingHooks)"
    ) in problems
    assert "says TARGET_VERIFY is its last shared reader, but" in problems
    assert "ends its shared reads on the target runner, but warcore_step_event_owner answers " \
        "'draft'" in problems  # fmt: skip


@pytest.mark.plugin_agnostic
def test_an_unrunnable_algorithm_is_skipped_by_sanitize_and_refused_by_run(
    make_warcore_pm: Callable[..., WarcorePluginManager],
    register_for_test: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pm = make_warcore_pm(OtherShapes())
    combos = combinations(pm, ["torch_native"], ["wctest_medusa"])
    skipped = combos[0].skipped
    assert skipped is not None and "not runnable: its family 'wctest_medusa'" in skipped
    with pytest.raises(
        ValueError, match="algorithm 'wctest_medusa' cannot run on the reference engine"
    ):
        Engine(EngineConfig(algorithm="wctest_medusa"), device="sim", pm=pm)
    register_for_test(OtherShapes())
    assert main(["run", "--device", "sim", "--algorithm", "wctest_medusa", "--requests", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "algorithm 'wctest_medusa' cannot run on the reference engine" in err[0]
    )


# -- a shape none of the built-ins has -------------------------------------------------------


def test_k_draft_verify_runs_matches_the_serial_loop_and_is_sound(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    pm = make_warcore_pm(kdv_plugin())
    report = assert_matches_serial("wctest_k_draft_verify", pm=pm, requests=24, seed=5)
    assert report.mean_accepted > 1.0  # the draft is the target: most drafts are accepted
    assert report.barriers["fine"] >= report.forwards[VERIFY]  # every verify step fenced finely
    published = {(m, p.value) for (m, p), n in report.published.items() if n}
    assert (VERIFY, "in_graph_node") in published  # the verify publishes
    assert (DECODE, "none") in published  # the draft decodes do not
    reports = assert_declarations_sound(
        algorithm="wctest_k_draft_verify", backend="torch_native", pm=pm
    )
    assert reports[0].checked > 0


@pytest.mark.plugin_agnostic
def test_k_draft_verify_runs_with_warcore_run(
    register_for_test: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    register_for_test(kdv_plugin())
    args = ["run", "--device", "sim", "--algorithm", "wctest_k_draft_verify", "--requests", "12"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tokens          identical to the serial loop" in out
    assert "acceptance" in out and "TARGET_VERIFY    in_graph_node" in out


@pytest.mark.parametrize("seed", range(10))
def test_an_owner_declared_one_phase_too_early_is_flagged(
    make_warcore_pm: Callable[..., WarcorePluginManager], seed: int
) -> None:
    """The last draft decode declared the last reader: the verify after it still reads the
    shared buffers. Flagged every time (ten seeds, ten traces)."""
    pm = make_warcore_pm(kdv_plugin(early=True))
    report = sanitize("torch_native", "wctest_k_draft_verify", pm=pm, seed=seed)
    assert report.violation is not None, report.format()
    v = report.violation
    assert (v.kind, v.published_by, v.runner, v.forward_mode) == (
        "later-forward",
        "draft DECODE",
        "target",
        VERIFY,
    )
    assert "the algorithm's publish phase is not the step's last reader" in v.describe()


def test_the_engine_refuses_a_draft_chain_shorter_than_the_drafts(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    step = StepSpec(
        prefill=(Phase("target", EXTEND),),
        decode=(Phase("draft", DECODE, repeat=2), Phase("target", VERIFY)),
    )
    pm = make_warcore_pm(DeclaredAlgorithm("wctest_short", step, drafter=self_draft))
    with pytest.raises(ValueError, match="draft chain runs 2 steps, but the engine verifies"):
        Engine(EngineConfig(algorithm="wctest_short", num_draft=4), device="sim", pm=pm)
    assert "wctest_short" in get_registry(pm).algorithms
