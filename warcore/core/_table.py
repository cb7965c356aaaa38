"""The resolved-decision cache: resolve once, then every replay is a dict lookup."""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ._boundary import Execution, RecordPoint
from ._decisions import decode_record_point, draft_extend_record_point, prefill_record_point
from ._manager import WarcorePluginManager, get_plugin_manager
from ._modes import ForwardMode
from ._resolve import (
    BoundaryResolution,
    PublishResolution,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)
from ._specs import BoundaryContext

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = [
    "Decision",
    "DecisionCache",
    "DecisionKey",
    "RunnerKind",
    "decide",
    "get_decision_cache",
    "runner_kind_for",
]


class RunnerKind(enum.Enum):
    DECODE = "decode"
    """Decode CUDA-graph runner: ``DECODE`` and ``TARGET_VERIFY``."""
    DRAFT_EXTEND = "draft_extend"
    """EAGLE draft-extend runner: ``DRAFT_EXTEND_V2``."""
    PREFILL = "prefill"
    """Prefill runner: ``EXTEND``."""
    DRAFT_DECODE = "draft_decode"
    """EAGLE draft-step runner: never publishes; the draft-extend after verify reads later."""

    # Identity hash (members are singletons): Enum's own __hash__ is a Python-level call, and
    # members key the per-replay decision lookup, where it cost ~0.1 µs per member.
    __hash__ = object.__hash__


def runner_kind_for(forward_mode: ForwardMode, *, draft: bool = False) -> RunnerKind:
    """The runner that executes ``forward_mode`` (modes no runner publishes for go to DECODE,
    whose decision is then ``RecordPoint.NONE``); ``draft`` for a draft model's runner."""
    if draft and forward_mode is ForwardMode.DECODE:
        return RunnerKind.DRAFT_DECODE
    if forward_mode is ForwardMode.EXTEND:
        return RunnerKind.PREFILL
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        return RunnerKind.DRAFT_EXTEND
    return RunnerKind.DECODE


DecisionKey = tuple[RunnerKind, "str | AttentionBackend", ForwardMode, BoundaryContext, Execution]


@dataclass(frozen=True, slots=True)
class Decision:
    """A runner's record point for one (backend, mode, context, execution), with its reasons."""

    record_point: RecordPoint
    declared: BoundaryResolution
    publish: PublishResolution
    kind: RunnerKind = RunnerKind.DECODE

    @property
    def source(self) -> str:
        """Why: the publish phase's provenance when it vetoed, else the declaration's."""
        if self.publish.source == "forced-coarse" or self.declared.source == "forced-coarse":
            return "forced-coarse"
        if self.kind is RunnerKind.DRAFT_DECODE:
            return "runner:draft-decode"
        if not self.publish.publishes and self.record_point is RecordPoint.NONE:
            return f"phase:{self.publish.source}"
        return self.declared.source


def decide(
    pm: WarcorePluginManager,
    kind: RunnerKind,
    backend: str | AttentionBackend,
    forward_mode: ForwardMode,
    context: BoundaryContext,
    execution: Execution,
) -> Decision:
    declared = resolve_shared_read_boundary(backend, forward_mode, context, pm=pm)
    publish = resolve_war_publish_phase(context.algorithm, forward_mode, pm=pm)
    if kind is RunnerKind.DECODE:
        point = decode_record_point(forward_mode, declared.boundary, publish.publishes, execution)
    elif kind is RunnerKind.DRAFT_EXTEND:
        point = draft_extend_record_point(
            forward_mode, declared.boundary, publish.publishes, execution
        )
    elif kind is RunnerKind.PREFILL:
        point = prefill_record_point(forward_mode, declared.boundary, publish.publishes)
    else:
        point = RecordPoint.NONE
    return Decision(point, declared, publish, kind)


class DecisionCache(dict["int | DecisionKey", Decision]):
    """``cache[key]`` resolves on the first miss and is a plain dict hit afterwards.

    Runners turn their keys into small-int handles once (:meth:`handle`, at construction or
    capture) and index with the handle per replay: a dict hit on an int, which costs about
    what a method call does, where hashing a five-field tuple key costs more. Tuple keys work
    too (tools, tests). The cache empties itself when a plugin is registered or unregistered;
    handles stay valid across that, and in every cache (an audit tool may swap a runner's).
    """

    _handles: ClassVar[dict[DecisionKey, int]] = {}
    _keys: ClassVar[dict[int, DecisionKey]] = {}
    _next: ClassVar[itertools.count[int]] = itertools.count(1)
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, pm: WarcorePluginManager) -> None:
        super().__init__()
        self.pm = pm
        pm.add_change_listener(self.clear)

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
        decision = self.resolve(self._keys[key] if isinstance(key, int) else key)
        self[key] = decision
        return decision

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
        for entry in list(self):
            key = self._keys.get(entry) if isinstance(entry, int) else entry
            if key is None or id(key[1]) in gone:
                del self[entry]
        with self._lock:
            for handle, key in list(self._keys.items()):
                if id(key[1]) in gone:
                    del self._keys[handle], self._handles[key]


def get_decision_cache(pm: WarcorePluginManager | None = None) -> DecisionCache:
    """The decision cache belonging to ``pm`` (the process-wide manager by default)."""
    pm = pm if pm is not None else get_plugin_manager()
    cache = pm.cached_decisions
    if not isinstance(cache, DecisionCache):
        cache = DecisionCache(pm)
        pm.cached_decisions = cache
    return cache
