"""The patched ``last_shared_read_runner``: whose event the scheduler's barrier waits on.

sglang's worker classes name the owner themselves; with the activation warcore's event owner
(:meth:`warcore.core.DecisionCache.event_owner`) names it from (algorithm, facts read off the
worker). Where warcore names no owner the barrier must be coarse, so the property returns a
runner whose event is always ``None`` (:class:`_NoEvent`), and no stale event of the step's
runners may outlive it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from warcore import StepFacts
from warcore.core import get_decision_cache

from .. import _sglang
from . import _state
from ._identity import process_algorithm


class _NoEvent:
    """The owner runner when warcore names none: its event is always None (coarse barrier)."""

    @property
    def shared_read_done_event(self) -> None:
        return None

    @shared_read_done_event.setter
    def shared_read_done_event(self, value: Any) -> None:
        pass


_NO_EVENT = _NoEvent()


def _worker_runners(worker: Any) -> tuple[Any, Any]:
    """(target runner, draft runner or None) of a worker."""
    state = worker.__dict__
    target_worker = state.get("_target_worker")
    target = target_worker.model_runner if target_worker is not None else state.get("_model_runner")
    drafter = state.get("_draft_worker")
    draft = getattr(drafter, "draft_runner", None) if drafter is not None else None
    return target, draft


def _owner_runner(worker: Any, original_fget: Callable[[Any], Any]) -> Any:
    target, draft = _worker_runners(worker)
    algo = getattr(target, "spec_algorithm", None)
    name = _sglang.warcore_algorithm(algo if algo is not None else process_algorithm())
    if name is None:
        return original_fget(worker)
    drafter = worker.__dict__.get("_draft_worker")
    facts = StepFacts(
        has_draft_model=drafter is not None,
        draft_extend_staged=bool(getattr(drafter, "last_draft_extend_staged", False)),
    )
    owner = get_decision_cache(_state.pm()).event_owner(name, facts).owner
    if owner == "target" and target is not None:
        return target
    if owner == "draft" and draft is not None:
        return draft
    for runner in (target, draft):  # coarse: no stale event may outlive this step either
        if runner is not None:
            runner.shared_read_done_event = None
    return _NO_EVENT


class _PatchedProperty(property):
    """A patched ``last_shared_read_runner`` (remembers the property it replaced)."""

    __warcore_original__: property


def make_owner_property(original: property) -> property:
    fget = original.fget
    assert fget is not None

    def last_shared_read_runner(self: Any) -> Any:
        if _state.current is None or _sglang.in_tree_active():
            return fget(self)
        try:
            return _owner_runner(self, fget)
        except Exception as exc:
            what = f"the event owner of {type(self).__qualname__}"
            _state.log_failure(("owner-failed", type(self)), what, exc, "no owner (coarse barrier)")
            return _NO_EVENT

    patched = _PatchedProperty(last_shared_read_runner, original.fset, original.fdel)
    patched.__warcore_original__ = original
    return patched
