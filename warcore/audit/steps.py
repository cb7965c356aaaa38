"""``warcore check``'s audit of algorithms' steps (issue 14): can the reference engine run each
algorithm, and do its hook answers agree with the step it declares?

An algorithm's :class:`~warcore.StepSpec` says which forward is its step's last shared reader;
``warcore_is_war_publish_phase`` and ``warcore_step_event_owner`` stay the authority where a
plugin answers them. A hook that contradicts the step is almost always a stale or mistaken
declaration (the runner publishes where the hook says, not where the step's forwards end), so
``check`` reports it: the defining plugin's own answer (which the runner follows) and a third
party's (a conflict with the step, resolved to the coarse fence) alike, naming who answered.
"""

from __future__ import annotations

from collections.abc import Iterable

from warcore.core import (
    PUBLISHING_MODES,
    ForwardMode,
    StepFacts,
    StepSpec,
    WarcorePluginManager,
    get_registry,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from warcore.engine.steps import engine_problem, step_of

__all__ = ["StepConflict", "step_audit", "step_problems"]

StepConflict = tuple[str, ForwardMode | None]
"""(algorithm, mode) of a publish-phase answer, (algorithm, ``None``) of an event owner's."""


def step_problems(pm: WarcorePluginManager) -> list[str]:
    """One line per algorithm the reference engine cannot run, and per hook answer that
    disagrees with the algorithm's step: its own plugin's (the runner follows it) or a third
    party's (a conflict: the coarse fence), each naming the plugin that answered."""
    return [line for _, line in step_audit(pm)]


def step_audit(pm: WarcorePluginManager) -> list[tuple[StepConflict | None, str]]:
    """:func:`step_problems`' lines, each with the hook call it reports a contradiction of
    (``None`` for an algorithm the engine cannot run): the matrix's line for the same conflict
    would say it a second time, without the step."""
    problems: list[tuple[StepConflict | None, str]] = []
    for name, offer in sorted(get_registry(pm).algorithms.items()):
        spec, plugin = offer.spec, offer.plugin
        if spec.engine != "warcore":
            continue  # another engine's algorithm (declarations only): not the engine's to run
        why = engine_problem(spec)
        if why is not None:
            line = f"algorithm {name!r} (plugin {plugin!r}) is not runnable by the reference "
            problems.append((None, line + f"engine: {why}"))
        step = step_of(spec)
        if step is not None:
            problems += _contradictions(pm, name, plugin, step)
    return problems


def _contradictions(
    pm: WarcorePluginManager, name: str, plugin: str, step: StepSpec
) -> list[tuple[StepConflict, str]]:
    """Every plugin answer about ``name`` that its ``step`` contradicts."""
    shape, lines = step.describe(), list[tuple[StepConflict, str]]()
    name_and_step = f"algorithm {name!r}: its step (plugin {plugin!r}: {shape})"
    for mode in sorted(PUBLISHING_MODES, key=lambda m: m.name):
        answer = resolve_war_publish_phase(name, mode, pm=pm)
        says = mode in step.publish_modes
        for who, value in _plugin_answers(answer.answers, says):
            line = (
                f"{name_and_step} says {mode.name} is "
                f"{'' if says else 'not '}its last shared reader, but "
                f"warcore_is_war_publish_phase answers {value} ({who}); "
                + _outcome(answer.source, "the runner follows the hook", "nothing publishes")
            )
            lines.append(((name, mode), line))
    facts = StepFacts(has_draft_model=step.has_draft_model)
    owner = resolve_step_event_owner(name, facts, pm=pm)
    for who, value in _plugin_answers(owner.answers, step.owner):
        line = (
            f"{name_and_step} ends its shared reads on the "
            f"{step.owner} runner, but warcore_step_event_owner answers {value!r} ({who}); "
            + _outcome(owner.source, "the barrier follows the hook", "no owner")
        )
        lines.append(((name, None), line))
    return lines


def _plugin_answers(
    answers: Iterable[tuple[str, object]], says: object
) -> list[tuple[str, object]]:
    """(``plugin:<name>``, answer) of each plugin that answered other than the step says (the
    step's own answer, ``step:<definer>``, stands beside them in a conflict)."""
    return [(f"plugin:{p}", v) for p, v in answers if not p.startswith("step:") and v != says]


def _outcome(source: str, followed: str, coarse: str) -> str:
    if source.startswith("plugin:"):
        return followed
    return f"a conflict ({source}): {coarse}, the coarse fence"
