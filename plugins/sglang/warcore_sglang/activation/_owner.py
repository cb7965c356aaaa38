"""The patched ``last_shared_read_runner``: whose event the scheduler's barrier waits on.

sglang's worker names the runner of the step's last shared-buffer reader itself, from its live
state (a per-step answer on some workers). warcore's event owner
(:meth:`warcore.core.DecisionCache.event_owner`) names one from (algorithm, facts read off the
worker). warcore can only take the owner away, never move it: which runner reads last cannot be
proven from (algorithm, facts) alone. So the patched property asks sglang's own getter first;
when warcore's owner is that very runner, and the release's runner in that role publishes only
through patched points, it is the answer; otherwise (warcore names no owner, or another
runner, or a role whose publish no patched point reaches: 0.5.21's EAGLE draft-extend runner
publishes before its replay without asking any declaration) the property returns a runner
whose event is always ``None`` (:class:`_NoEvent`): the barrier is coarse, and no stale event
of the step's runners may outlive it.
"""

from __future__ import annotations

import logging
from typing import Any

from warcore import StepFacts
from warcore.core import get_decision_cache

from ..declarations import oracle
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
    """(target runner, draft runner or None) of a worker, from its own attributes (some
    workers hand every attribute they lack to their target worker: ``__getattr__``)."""
    state = vars(worker)
    target_worker = state.get("_target_worker")
    target = target_worker.model_runner if target_worker is not None else state.get("_model_runner")
    drafter = state.get("_draft_worker")
    draft = getattr(drafter, "draft_runner", None) if drafter is not None else None
    return target, draft


_OWN = "own"
"""warcore's owner where it cannot name the worker's algorithm: sglang's own."""


def _owner_role(worker: Any, facts: StepFacts) -> str | None:
    """``"target"``, ``"draft"``, :data:`_OWN`, or ``None`` (no owner) for this worker's
    algorithm under ``facts``."""
    target, _ = _worker_runners(worker)
    algo = getattr(target, "spec_algorithm", None)
    name = oracle.warcore_algorithm(algo if algo is not None else process_algorithm())
    if name is None:
        return _OWN
    return get_decision_cache(_state.pm()).event_owner(name, facts).owner


def _warcore_runner(worker: Any, own: Any) -> Any:
    """The runner warcore's event owner names for this worker's step (``None``: no owner, or
    a role whose runner publishes where no patched point reaches), remembered on the worker
    per facts. A worker without a drafter has one set of facts: where warcore's runner is
    sglang's there, ``own`` is remembered under :data:`_SAME` (the property's hit)."""
    drafter = vars(worker).get("_draft_worker")
    staged = bool(getattr(drafter, "last_draft_extend_staged", False))
    key = ("owner", drafter is not None, staged)
    mine = _state.cached(worker, key, lambda: _runner_for(worker, key[1], key[2]))
    mine = own if mine is _OWN else mine
    if mine is own and drafter is None:
        _state.cached(worker, _SAME, lambda: own)
    return mine


_SAME = "owner-is-sglangs"
"""The cache key of a drafter-less worker's runner that warcore's owner and sglang's agree on."""


def _runner_for(worker: Any, has_draft: bool, staged: bool) -> Any:
    role = _owner_role(worker, StepFacts(has_draft, staged))
    state = _state.current
    if role == _OWN or state is None or role in state.release.unbounded_owners:
        return _OWN if role == _OWN else None
    target, draft = _worker_runners(worker)
    return target if role == "target" else draft if role == "draft" else None


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
    getattribute, cache = object.__getattribute__, _state.CACHE

    def last_shared_read_runner(self: Any) -> Any:
        # sglang's answer for this step, from its live state (a getter asks no patched point:
        # digested, or, for a worker not audited, bounded in turn)
        own = fget(self)
        try:  # the hit: what sglang names is warcore's owner too (never there when inactive)
            if getattribute(self, cache)[_SAME] is own:
                return own
        except (AttributeError, KeyError):
            pass
        if _state.current is None or oracle.in_tree_active():
            return own
        try:
            mine = _warcore_runner(self, own)
        except Exception as exc:
            what = f"the event owner of {type(self).__qualname__}"
            _state.log_failure(("owner-failed", type(self)), what, exc, "no owner (coarse barrier)")
            return _coarse(self, own)
        if mine is own:
            return own
        if mine is not None:
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
