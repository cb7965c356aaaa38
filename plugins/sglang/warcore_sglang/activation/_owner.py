"""The patched ``last_shared_read_runner``: whose event the scheduler's barrier waits on.

sglang's worker names the runner of the step's last shared-buffer reader itself, from its live
state (a per-step answer on some workers). warcore's event owner
(:meth:`warcore.core.DecisionCache.event_owner`) names one from (algorithm, facts read off the
worker). warcore can only take the owner away, never move it: which runner reads last cannot be
proven from (algorithm, facts) alone. So the patched property asks sglang's own getter first;
when warcore's owner is that very runner, it is the answer; otherwise (warcore names no owner,
or another runner) the property returns a runner whose event is always ``None``
(:class:`_NoEvent`): the barrier is coarse, and no stale event of the step's runners may
outlive it.
"""

from __future__ import annotations

import contextlib
import logging
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


_OWN = "own"
"""warcore's owner where it cannot name the worker's algorithm: sglang's own."""


def _owner_name(worker: Any, facts: StepFacts) -> str | None:
    """``"target"``, ``"draft"``, :data:`_OWN`, or ``None`` (no owner) for this worker's
    algorithm under ``facts``."""
    target, _ = _worker_runners(worker)
    algo = getattr(target, "spec_algorithm", None)
    name = _sglang.warcore_algorithm(algo if algo is not None else process_algorithm())
    if name is None:
        return _OWN
    return get_decision_cache(_state.pm()).event_owner(name, facts).owner


def _warcore_runner(worker: Any, own: Any) -> Any:
    """The runner warcore's event owner names for this worker's step (``None``: no owner),
    remembered per worker and facts until warcore's plugins or switches change."""
    state = worker.__dict__
    drafter = state.get("_draft_worker")
    key = (drafter is not None, bool(getattr(drafter, "last_draft_extend_staged", False)))
    cached = state.get(_state.OWNER)
    if cached is None or cached[0] != _state.gen:
        cached = state[_state.OWNER] = (_state.gen, {})
        with contextlib.suppress(TypeError):
            _state.CACHED.add(worker)
    owner = cached[1].get(key, _MISSING)
    if owner is _MISSING:
        owner = cached[1][key] = _owner_name(worker, StepFacts(*key))
    if owner == _OWN:
        return own
    target, draft = _worker_runners(worker)
    return target if owner == "target" else draft if owner == "draft" else None


_MISSING = object()


def _coarse(worker: Any, own: Any) -> _NoEvent:
    for runner in (own, *_worker_runners(worker)):  # no stale event may outlive this step
        if runner is not None and runner is not _NO_EVENT:
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
        own = _sglang.own(fget, self)  # sglang's answer for this step, from its live state
        try:
            ours = _warcore_runner(self, own)
        except Exception as exc:
            what = f"the event owner of {type(self).__qualname__}"
            _state.log_failure(("owner-failed", type(self)), what, exc, "no owner (coarse barrier)")
            return _coarse(self, own)
        if ours is own:
            return own
        if ours is not None:
            _state.log_once(
                ("owner-differs", type(self)),
                logging.WARNING,
                f"warcore-sglang: warcore's event owner for {type(self).__qualname__} is not "
                "the runner sglang's worker names for this step: coarse barrier (warcore never "
                "moves the owner to another runner)",
            )
        return _coarse(self, own)

    patched = _PatchedProperty(last_shared_read_runner, original.fset, original.fdel)
    patched.__warcore_original__ = original
    return patched
