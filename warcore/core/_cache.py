"""The resolved-decision cache: resolve once, then every replay is a dict lookup."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from ._boundary import Execution, RecordPoint, SharedReadBoundary
from ._decisions import RunnerKind, staged_prefill_point
from ._decisions import record_point as point_for
from ._manager import WarcorePluginManager, get_plugin_manager
from ._modes import ForwardMode
from ._registry import get_registry
from ._resolve import (
    BoundaryResolution,
    OwnerResolution,
    PluginFailure,
    PublishResolution,
    VetoResolution,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from ._specs import Backend, BoundaryContext, StepFacts

__all__ = [
    "MAX_RESOLUTIONS",
    "UNSETTLED_RESOLUTIONS",
    "Decision",
    "DecisionCache",
    "DecisionKey",
    "decide",
    "get_decision_cache",
]


T = TypeVar("T")

UNSETTLED_RESOLUTIONS = 4
"""Resolutions of one decision in a row that the resolving thread's own plugin code unsettles
(a hook registers or unregisters a plugin while it is asked, so the answer was given by a plugin
set that no longer exists) before the cache gives up: the decision is the coarse fence, blamed
on that plugin (``default:failed:<plugin>``, one warning). A hook that registers a helper plugin
once costs one more resolution, not this."""
MAX_RESOLUTIONS = 64
"""Resolutions of one decision in a row, whoever changes the plugin set meanwhile (other
threads too), before the cache gives up the same way."""


DecisionKey = tuple[RunnerKind, "str | Backend", ForwardMode, BoundaryContext, Execution]


@dataclass(frozen=True, slots=True)
class Decision:
    """A runner's record point for one (backend, mode, context, execution), with its reasons."""

    record_point: RecordPoint
    declared: BoundaryResolution
    publish: PublishResolution
    kind: RunnerKind = RunnerKind.DECODE
    veto: VetoResolution | None = None
    withdrawn: bool = False
    """This prefill batch's backend withdrew the static ``PRE_REPLAY`` (per-batch answer)."""
    failure: PluginFailure | None = None
    """No decision settled: this plugin kept changing the plugin set while it was asked (see
    :data:`UNSETTLED_RESOLUTIONS`); the coarse fence."""
    stage_point: RecordPoint = RecordPoint.NONE
    """Where this prefill records for a batch whose later shared reads the algorithm's stager
    staged (:func:`~warcore.core.staged_prefill_point`); ``NONE``: staging changes nothing."""
    staged: bool = False
    """This batch's stager staged the step's later reads: it records at ``stage_point``."""

    @property
    def refines_per_batch(self) -> bool:
        """A prefill that publishes before its replay only if its backend agrees per batch
        (``AttentionBackend.refine_prefill_boundary``)."""
        return self.kind is RunnerKind.PREFILL and self.record_point is RecordPoint.PRE_REPLAY

    @property
    def source(self) -> str:
        """Why: no settled answer, force-coarse, a veto, the runner, the publish phase, else
        the declaration."""
        if self.failure is not None:
            return f"default:failed:{self.failure.plugin}"
        if self.publish.source == "forced-coarse" or self.declared.source == "forced-coarse":
            return "forced-coarse"
        if self.veto is not None and self.veto.vetoed:
            return self.veto.source
        if self.withdrawn:
            return f"per-batch:{self.declared.backend}"
        if self.staged:
            return f"staged:{self.publish.algorithm}"
        if self.kind is RunnerKind.DRAFT_DECODE and not self.publish.publishes:
            return "runner:draft-decode"
        if not self.publish.publishes and self.record_point is RecordPoint.NONE:
            return f"phase:{self.publish.source}"
        return self.declared.source


def decide(
    pm: WarcorePluginManager,
    kind: RunnerKind,
    backend: str | Backend,
    forward_mode: ForwardMode,
    context: BoundaryContext,
    execution: Execution,
) -> Decision:
    """``kind``'s decision for one forward, resolved now through ``pm``'s plugins (a
    :class:`DecisionCache` resolves each key once with this)."""
    eager = execution is Execution.EAGER
    declared = resolve_shared_read_boundary(backend, forward_mode, context, eager=eager, pm=pm)
    publish = resolve_war_publish_phase(context.algorithm, forward_mode, pm=pm)
    veto = resolve_fast_path_veto(forward_mode, context, pm=pm)
    point = (
        RecordPoint.NONE
        if veto.vetoed
        else point_for(kind, forward_mode, declared.boundary, publish.publishes, execution)
    )
    stage = RecordPoint.NONE
    if point is RecordPoint.NONE and not publish.publishes:
        offer = get_registry(pm).algorithms.get(context.algorithm)
        spec = offer.spec if offer is not None else None
        step = spec.step if spec is not None else None
        stage = staged_prefill_point(
            kind,
            forward_mode,
            declared.boundary,
            reads_later=step is not None and step.prefill_reads_later,
            has_stager=spec is not None and spec.prefill_shared_read_stager is not None,
            vetoed=veto.vetoed,
        )
    return Decision(point, declared, publish, kind, veto, stage_point=stage)


class DecisionCache(dict["int | DecisionKey", Decision]):
    """``cache[key]`` resolves on the first miss and is a plain dict hit afterwards.

    Runners turn their keys into small-int handles once (:meth:`handle`, at construction or
    capture) and index with the handle per replay: a dict hit on an int, which costs about
    what a method call does, where hashing a five-field tuple key costs more. Tuple keys work
    too (tools, tests). The cache empties itself when a plugin is registered or unregistered
    or a run-time switch changes; handles stay valid across that, and in every cache (an audit
    tool may swap a runner's). A decision resolved while the plugin set changed is never
    stored: the next lookup resolves again under the new set.
    """

    _handles: ClassVar[dict[DecisionKey, int]] = {}
    _keys: ClassVar[dict[int, DecisionKey]] = {}
    _next: ClassVar[itertools.count[int]] = itertools.count(1)
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, pm: WarcorePluginManager) -> None:
        super().__init__()
        self.pm = pm
        self._store_lock = threading.Lock()
        self._owners: dict[tuple[str, StepFacts], OwnerResolution] = {}
        pm.add_change_listener(self._invalidate)

    def _invalidate(self) -> None:
        with self._store_lock:
            self.clear()
            self._owners.clear()

    @classmethod
    def handle(cls, key: DecisionKey) -> int:
        """A stable int standing for ``key`` in every decision cache."""
        with cls._lock:
            handle = cls._handles.get(key)
            if handle is None:
                handle = cls._handles[key] = next(cls._next)
                cls._keys[handle] = key
            return handle

    def __missing__(self, key: int | DecisionKey) -> Decision:
        full = self._keys[key] if isinstance(key, int) else key
        return self._current(
            lambda: self.resolve(full),
            lambda d: self.__setitem__(key, d),
            lambda failure: _unsettled_decision(full, failure),
            _describe_key(full),
        )

    def event_owner(self, algorithm: str, facts: StepFacts) -> OwnerResolution:
        """The step's event owner for (algorithm, facts), resolved once per plugin set."""
        key = (algorithm, facts)
        owner = self._owners.get(key)
        if owner is None:
            owner = self._current(
                lambda: resolve_step_event_owner(algorithm, facts, pm=self.pm),
                lambda o: self._owners.__setitem__(key, o),
                lambda failure: OwnerResolution(
                    algorithm, facts, None, f"default:failed:{failure.plugin}", (), (failure,)
                ),
                f"the event owner of algorithm {algorithm!r}",
            )
        return owner

    def _current(
        self,
        resolve: Callable[[], T],
        store: Callable[[T], None],
        coarse: Callable[[PluginFailure], T],
        where: str,
    ) -> T:
        """Resolve and store, never storing what an older plugin set answered: the manager
        bumps its generation before it clears the caches, so a check under the lock that
        clearing takes sees every change that happened while resolving (and resolves again).

        Again a bounded number of times: a plugin whose hook registers another plugin each
        time it is asked would have this resolve for ever. Then the answer is ``coarse`` (the
        coarse fence), blamed on that plugin, the plugins it registered are unregistered, and
        the answer is stored until the plugin set changes again."""
        pm = self.pm
        unsettled = 0
        for _ in range(MAX_RESOLUTIONS):
            generation = pm.generation
            mine = pm.changes_here()[0]
            value = resolve()
            with self._store_lock:
                if pm.generation == generation:
                    store(value)
                    return value
                seen = pm.generation
            if pm.changes_here()[0] != mine:  # this resolution's own hooks changed the set
                unsettled += 1
                if unsettled >= UNSETTLED_RESOLUTIONS:
                    break
        failure = _blame(pm, where, unsettled)
        if unsettled >= UNSETTLED_RESOLUTIONS and pm.unregister_registered_by(failure.plugin):
            seen = pm.generation  # the set without its helpers: the coarse answer stands
        value = coarse(failure)
        with self._store_lock:
            if pm.generation == seen:  # nothing changed since: until something does
                store(value)
        return value

    def resolve(self, key: DecisionKey) -> Decision:
        """Resolve ``key`` through the plugins (subclasses may decide differently)."""
        return decide(self.pm, *key)

    def record_point(self, key: int | DecisionKey) -> RecordPoint:
        return self[key].record_point

    def forget(self, backends: Iterable[object]) -> None:
        """Drop the entries of these backend objects. Keys hold backend objects (a wrapper is
        resolved through its children), and a backend holds its engine's pools: an engine
        that closes forgets its own, or every engine built on this manager would stay alive."""
        gone = {id(b) for b in backends}
        with self._store_lock:
            for entry in list(self):
                key = self._keys.get(entry) if isinstance(entry, int) else entry
                if key is None or id(key[1]) in gone:
                    del self[entry]
        with self._lock:
            for handle, key in list(self._keys.items()):
                if id(key[1]) in gone:
                    del self._keys[handle], self._handles[key]


def _backend_name(backend: str | Backend) -> str:
    return backend if isinstance(backend, str) else str(getattr(backend, "name", backend))


def _describe_key(key: DecisionKey) -> str:
    _, backend, mode, context, _ = key
    return f"backend {_backend_name(backend)!r}, mode {mode.name}, algorithm {context.algorithm!r}"


def _blame(pm: WarcorePluginManager, where: str, unsettled: int) -> PluginFailure:
    """The failure of a decision that never settled, logged once per plugin and hook: the
    plugin whose code changed the plugin set while it was asked, if it was this thread's."""
    culprit = pm.changes_here()[1]
    if unsettled < UNSETTLED_RESOLUTIONS:
        plugin, hook = "runtime", "register"
        error = f"the plugin set changed during {MAX_RESOLUTIONS} resolutions in a row"
    else:
        plugin, hook = culprit if culprit is not None else ("runtime", "register")
        error = "registers or unregisters a plugin every time it is asked, so no answer settles"
    pm.log_once(
        ("unsettled", plugin, hook),
        logging.WARNING,
        f"plugin {plugin!r} hook {hook!r} {error} (resolving {where}); coarse fence",
    )
    return PluginFailure(plugin, hook, error)


def _unsettled_decision(key: DecisionKey, failure: PluginFailure) -> Decision:
    kind, backend, mode, context, _ = key
    name, source = _backend_name(backend), f"default:failed:{failure.plugin}"
    unknown = SharedReadBoundary.UNKNOWN
    declared = BoundaryResolution(name, mode, context, unknown, source, failures=(failure,))
    publish = PublishResolution(context.algorithm, mode, False, source, failures=(failure,))
    return Decision(RecordPoint.NONE, declared, publish, kind, failure=failure)


def get_decision_cache(pm: WarcorePluginManager | None = None) -> DecisionCache:
    """The decision cache belonging to ``pm`` (the process-wide manager by default)."""
    pm = pm if pm is not None else get_plugin_manager()
    cache = pm.cached_decisions
    if not isinstance(cache, DecisionCache):
        cache = DecisionCache(pm)
        pm.cached_decisions = cache
    return cache
