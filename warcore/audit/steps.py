"""``warcore check``'s audit of algorithms' steps (issue 14): can the reference engine run each
algorithm, and do its hook answers agree with the step it declares?

An algorithm's :class:`~warcore.StepSpec` says which forward is its step's last shared reader;
``warcore_is_war_publish_phase`` and ``warcore_step_event_owner`` stay the authority where a
plugin answers them. A hook that contradicts the step is almost always a stale or mistaken
declaration (the runner publishes where the hook says, not where the step's forwards end), so
``check`` reports it.
"""

from __future__ import annotations

from warcore.core import (
    PUBLISHING_MODES,
    StepFacts,
    WarcorePluginManager,
    get_registry,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from warcore.engine.steps import engine_problem, step_of

__all__ = ["step_problems"]


def step_problems(pm: WarcorePluginManager) -> list[str]:
    """One line per algorithm the reference engine cannot run, and per hook answer that
    disagrees with the algorithm's step."""
    problems: list[str] = []
    for name, offer in sorted(get_registry(pm).algorithms.items()):
        spec, plugin = offer.spec, offer.plugin
        if spec.engine != "warcore":
            continue  # another engine's algorithm (declarations only): not the engine's to run
        why = engine_problem(spec)
        if why is not None:
            problems.append(
                f"algorithm {name!r} (plugin {plugin!r}) is not runnable by the reference "
                f"engine: {why}"
            )
        step = step_of(spec)
        if step is None:
            continue
        shape = step.describe()
        for mode in sorted(PUBLISHING_MODES, key=lambda m: m.name):
            answer = resolve_war_publish_phase(name, mode, pm=pm)
            says = mode in step.publish_modes
            if answer.source.startswith("plugin:") and answer.publishes != says:
                problems.append(
                    f"algorithm {name!r}: its step ({shape}) says {mode.name} is "
                    f"{'' if says else 'not '}its last shared reader, but "
                    f"warcore_is_war_publish_phase answers {answer.publishes} "
                    f"({answer.source}); the runner follows the hook"
                )
        facts = StepFacts(has_draft_model=step.has_draft_model)
        owner = resolve_step_event_owner(name, facts, pm=pm)
        if owner.source.startswith("plugin:") and owner.owner != step.owner:
            problems.append(
                f"algorithm {name!r}: its step ({shape}) ends its shared reads on the "
                f"{step.owner} runner, but warcore_step_event_owner answers {owner.owner!r} "
                f"({owner.source}); the barrier follows the hook"
            )
    return problems
