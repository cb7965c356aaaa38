"""Activation: make a running sglang 0.5.23 process consult warcore.

:func:`install` patches sglang's declaration points in this process so that installed warcore
plugins, vetoes and force-coarse act on sglang's real runners:

=====================================================  =====================================
patched (sglang 0.5.23)                                answers
=====================================================  =====================================
``shared_read_ends`` of ``AttentionBackend`` and of    warcore's resolution for the backend's
every subclass defining its own (also classes         warcore name and this process's context,
defined later: ``AttentionBackend.__init_subclass__``) never earlier than sglang's own answer
                                                       for the instance; a veto, force-coarse,
                                                       or a non-publishing phase -> UNKNOWN;
                                                       cached per instance
``AttentionBackend.resolve_prefill_shared_read_ends``  sglang's env switches, then warcore's
                                                       prefill decision (declaration, vetoes,
                                                       the algorithm's gate); on the snapshot
                                                       path sglang's per-batch snapshot, never
                                                       earlier than another plugin's answer
``SpeculativeAlgorithm`` / ``CustomSpecAlgo``          warcore's publish phase for ``EXTEND``
``.supports_prefill_shared_read_done``
``last_shared_read_runner`` of ``BaseTpWorker``,       the runner warcore's event owner names
``BaseSpecWorker`` and each spec worker defining it    for (algorithm, facts read from the
                                                       worker); no owner -> a runner with no
                                                       event (coarse barrier)
``DecodeCudaGraphRunner._resolve_shared_read_ends``    a dict lookup (backend, planted?, mode)
                                                       filled from the backend's patched
                                                       answer (IN_REPLAY without an in-graph
                                                       event -> POST_REPLAY, as sglang); emptied
                                                       when plugins or switches change
=====================================================  =====================================

Plus two small wraps: ``attention_backend_setup._build_full_attention_backend_from_str`` tags
each backend sglang's registry builds with its warcore name (``fa3`` and ``fa4`` build one
class), and, with ``WARCORE_SGLANG_CHECK_RANKS``, ``Scheduler.__init__`` ends with the rank
check (:func:`warcore.audit.ranks.check_ranks_agree` over sglang's world CPU group).

Where an UNKNOWN answer reaches the decode runner, the runner's mailbox
(``model_runner.shared_read_done_event``) is cleared: sglang's runner does not clear it, and an
event an earlier phase left there must not stand for a forward that publishes nothing.

Modules not imported yet are patched when they are imported (a post-import hook on
``sys.meta_path``), so :func:`install` imports nothing of sglang itself: it is what sglang's
``load_plugins()`` calls (entry point ``sglang.srt.plugins``: ``warcore``) first thing in
every server process when ``WARCORE_SGLANG=1`` (through :mod:`warcore_sglang._entry`, which
activates only where a model runner may be built). :func:`uninstall` removes the hook and restores
every patched attribute exactly (the same objects; an attribute that was inherited is deleted
again).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from warcore import BoundaryContext, ForwardMode, SharedReadBoundary, StepFacts, latest
from warcore.core import (
    BoundaryResolution,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)

from . import _sglang
from ._names import LEAVES, PREFIX, REGISTRY_CLASSES, SRT, WRAPPERS, warcore_name
from ._post_import import PostImportFinder

__all__ = [
    "ENV_ACTIVATE",
    "ENV_CHECK_RANKS",
    "UnsupportedSglangError",
    "explain",
    "explain_prefill",
    "identify",
    "install",
    "is_installed",
    "rank_cells",
    "sglang_plugin",
    "uninstall",
]

ENV_ACTIVATE = "WARCORE_SGLANG"
ENV_CHECK_RANKS = "WARCORE_SGLANG_CHECK_RANKS"

logger = logging.getLogger("warcore.sglang")

_TRUE = {"1", "true", "yes", "on"}
_MISSING = object()
_SRE = "_warcore_sglang_sre"
_PREFILL = "_warcore_sglang_prefill"
_LAST = "_warcore_sglang_last"  # a decode runner's last answer


class UnsupportedSglangError(RuntimeError):
    """The installed sglang is outside the range warcore-sglang was read from and tested on."""


# -- state ---------------------------------------------------------------------------------


@dataclass
class _Patch:
    owner: Any
    attr: str
    original: Any  # vars(owner)[attr], or _MISSING when the attribute was inherited


@dataclass
class _State:
    pm: WarcorePluginManager
    patches: list[_Patch] = field(default_factory=list)
    finder: PostImportFinder | None = None
    plugin_names: frozenset[str] = frozenset()


_lock = threading.RLock()
_state: _State | None = None
_gen = 0
"""Bumped when warcore's plugins or switches change: every cached answer of an older
generation is recomputed on next use."""
_DECODE: dict[Any, list[dict[Any, Any]]] = {}
"""attn backend -> [answers without an in-graph event, with one], each mode -> ends."""
_PUBLISH: dict[Any, bool] = {}
"""sglang algorithm -> warcore's publish phase for EXTEND."""
_CACHED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Backends and decode runners holding a per-instance cache: :func:`uninstall` takes it off
them again."""


def _invalidate() -> None:
    global _gen
    with _lock:
        _gen += 1
        _DECODE.clear()
        _PUBLISH.clear()


def _on_change() -> None:
    if _state is not None:
        _invalidate()


def _pm() -> WarcorePluginManager:
    """The process-wide manager; a reset one is followed (listener moved, caches dropped)."""
    pm = get_plugin_manager()
    state = _state
    if state is not None and state.pm is not pm:
        with _lock:
            if state.pm is not pm:
                with contextlib.suppress(ValueError, AttributeError):
                    state.pm.remove_change_listener(_on_change)
                state.pm = pm
                state.plugin_names = _sglang_plugin_names(pm)
                pm.add_change_listener(_on_change)
                _invalidate()
    return pm


def _sglang_plugin_names(pm: WarcorePluginManager) -> frozenset[str]:
    module = sys.modules.get("warcore_sglang.plugin")
    return frozenset(name for name, plugin in pm.list_name_plugin() if plugin is module)


def _log_once(key: object, level: int, message: str) -> None:
    get_plugin_manager().log_once(("warcore-sglang", key), level, message)


# -- the instance's identity: its warcore name and context ---------------------------------


@functools.lru_cache(maxsize=1)
def _class_names() -> dict[str, str]:
    """``module:Qualname`` of each class warcore-sglang names -> its warcore name."""
    table: dict[str, str] = {}
    for name, ref in REGISTRY_CLASSES.items():
        table.setdefault(SRT + ref, warcore_name(name))  # first registry name wins (fa3 / fa4)
    for name, ref in LEAVES.items():
        table[SRT + ref] = name
    for name, shape in WRAPPERS.items():
        table[SRT + shape.cls] = name
    return table


def _name_of_class(cls: type) -> str | None:
    """The warcore name of the nearest class in ``cls``'s MRO that warcore-sglang names; None
    when a class it does not name declares for itself first."""
    table = _class_names()
    for klass in cls.__mro__:
        name = table.get(f"{klass.__module__}:{klass.__qualname__}")
        if name is not None:
            return name
        if "shared_read_ends" in vars(klass):
            return None
    return None


def _name_of(backend: Any) -> str | None:
    tag = getattr(backend, "__dict__", {}).get(_sglang.TAG)
    return tag if isinstance(tag, str) else _name_of_class(type(backend))


def _children_of(name: str, backend: Any) -> list[Any]:
    if name == "sglang_hybrid":
        return [backend.prefill_backend, backend.decode_backend]
    if name == "sglang_tbo":
        return [backend.primary, *backend.children]
    if name == "sglang_hybrid_linear":
        return list(backend.attn_backend_list)
    if name == "sglang_dots_swa_mla":
        return [backend.backend]
    if name == "sglang_minimax_hybrid":
        return [backend.sparse, backend.dense]
    raise AssertionError(name)


def _structure(backend: Any, flags: dict[str, Any], depth: int = 0) -> str | None:
    """``backend``'s warcore name, with the flags naming its children added to ``flags``;
    ``None`` when the tree cannot be said by name (an unknown class, children of a shape the
    flags cannot express)."""
    name = _name_of(backend)
    if name is None or name not in WRAPPERS:
        return name
    if depth > _sglang.MAX_DEPTH:
        return None
    shape = WRAPPERS[name]
    kids = _children_of(name, backend)
    entries = list(shape.children)
    if len(kids) != len(entries):
        if len(set(entries)) != 1:
            return None
        entries = entries[:1] * len(kids)  # two-batch overlap: every child built alike
    for entry, kid in zip(entries, kids, strict=True):
        kid_name = _structure(kid, flags, depth + 1)
        if kid_name is None:
            return None
        if entry.startswith("="):
            if kid_name != entry[1:]:
                return None
            continue
        value = kid_name[len(PREFIX) :]
        if flags.setdefault(entry, value) != value:
            return None  # two children the one flag would have to name differently
    if name == "sglang_hybrid":
        flags["sglang_spec_attn_is_decode"] = bool(backend.spec_attn_is_decode)
    return name


def _runner_algorithm(backend: Any, depth: int = 0) -> Any:
    """``model_runner.spec_algorithm`` of ``backend``, or of a child of a wrapper."""
    runner = getattr(backend, "__dict__", {}).get("model_runner")
    algo = getattr(runner, "spec_algorithm", None)
    if algo is not None or depth > _sglang.MAX_DEPTH:
        return algo
    name = _name_of(backend)
    if name in WRAPPERS:
        with contextlib.suppress(Exception):
            for kid in _children_of(name, backend):
                algo = _runner_algorithm(kid, depth + 1)
                if algo is not None:
                    return algo
    return None


def _process_algorithm(backend: Any = None) -> Any:
    """The speculative algorithm of ``backend``'s runner, else of this server process, else
    none."""
    algo = _runner_algorithm(backend) if backend is not None else None
    if algo is not None:
        return algo
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_spec

        return _sglang.api().SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    return _sglang.api().SpeculativeAlgorithm.NONE


def _offload_flags() -> dict[str, bool]:
    """warcore's offload flags, from sglang's runtime context (the server args' memory bag)."""
    try:
        from sglang.srt.runtime_context import get_memory

        memory = get_memory()
        on = {
            "hicache": bool(memory.enable_hierarchical_cache),
            "hicache_storage": memory.hicache_storage_backend is not None,
            "lmcache": bool(memory.enable_lmcache),
        }
    except Exception:  # not published yet (no server args in this process)
        return {}
    return {k: v for k, v in on.items() if v}


def identify(backend: Any) -> tuple[str | None, BoundaryContext]:
    """``backend``'s warcore name (``None``: warcore-sglang cannot name it) and the context
    warcore resolves it under: this process's algorithm, the flags naming the wrapper's
    children, and the offload flags of the server args."""
    structure: dict[str, Any] = {}
    name = _structure(backend, structure)
    algo = _sglang.warcore_algorithm(_process_algorithm(backend)) or "none"
    flags = {**(structure if name is not None else {}), **_offload_flags()}
    return name, BoundaryContext(algo, flags)


# -- answers -------------------------------------------------------------------------------


def _sglang_own(backend: Any, smode: Any) -> SharedReadBoundary:
    with _sglang.in_tree():
        return _sglang.boundary_of(type(backend).shared_read_ends(backend, smode))


def _declared(backend: Any, mode: ForwardMode) -> tuple[SharedReadBoundary, BoundaryContext, str]:
    """warcore's boundary for the instance, never earlier than sglang's own answer for it, and
    its provenance."""
    pm = _pm()
    name, ctx = identify(backend)
    smode = _sglang.sglang_mode(mode)
    own = _sglang_own(backend, smode)
    cls = type(backend).__qualname__
    if name is None:
        _log_once(
            ("unnamed", type(backend)),
            logging.WARNING,
            f"warcore-sglang: {cls} is not a backend warcore-sglang can "
            "name: its own declaration applies (with warcore's vetoes and force-coarse); no "
            "plugin can declare for it",
        )
        return own, ctx, f"sglang:{cls}.shared_read_ends (unnamed: no plugin can declare)"
    resolution = resolve_shared_read_boundary(name, mode, ctx, pm=pm)
    boundary = resolution.boundary
    if own > boundary:
        _log_once(
            ("later", type(backend), mode, ctx),
            logging.WARNING,
            f"warcore-sglang: {cls} itself declares {own.name} for "
            f"{mode.name}, later than warcore's {boundary.name} for {name!r} under {ctx}: "
            f"using {own.name}",
        )
        return (
            own,
            ctx,
            (f"sglang:{cls}.shared_read_ends (later than {resolution.source}'s {boundary.name})"),
        )
    source = resolution.source
    if len({b for _, b in resolution.answers}) > 1:  # say who answered what
        source += " (" + ", ".join(f"{p}: {b.name}" for p, b in resolution.answers) + ")"
    return boundary, ctx, source


# -- explain: the answer with its provenance (the trace and the sanitizer report it) ------


def explain(backend: Any, smode: Any) -> tuple[SharedReadBoundary, str]:
    """What the patched ``shared_read_ends`` answers for (instance, sglang mode), and why: a
    provenance such as ``plugin:sglang``, ``default:failed:<plugin>``, ``forced-coarse``,
    ``veto:...`` or ``sglang:<Class>.shared_read_ends (...)``."""
    mode = _sglang.warcore_mode(smode)
    boundary, ctx, source = _declared(backend, mode)
    pm = _pm()
    if pm.config.force_coarse:
        return SharedReadBoundary.UNKNOWN, "forced-coarse"
    veto = resolve_fast_path_veto(mode, ctx, pm=pm)
    if veto.vetoed:
        return SharedReadBoundary.UNKNOWN, veto.source
    # EXTEND's gate is the algorithm's supports_prefill_shared_read_done (patched too); no
    # other sglang runner gates on the algorithm, so a phase that does not publish is UNKNOWN.
    if mode is not ForwardMode.EXTEND:
        phase = resolve_war_publish_phase(ctx.algorithm, mode, pm=pm)
        if not phase.publishes:
            return SharedReadBoundary.UNKNOWN, f"not the publish phase ({phase.source})"
    return boundary, source


def explain_prefill(backend: Any) -> tuple[SharedReadBoundary, str]:
    """The static prefill decision of the patched ``resolve_prefill_shared_read_ends`` for the
    instance (sglang's switches, warcore's gate, the declaration) and its provenance. A
    backend's per-batch snapshot can only move it later."""
    base = _base_module()
    if base.envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return SharedReadBoundary.UNKNOWN, "sglang:SGLANG_FORCE_COARSE_WAR_BARRIER"
    if not base.envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.get():
        return SharedReadBoundary.UNKNOWN, "sglang:SGLANG_ENABLE_PREFILL_WAR_READ_DONE is off"
    closed, _, _ = _prefill_decision(backend)
    if closed is not None:
        return SharedReadBoundary.UNKNOWN, closed
    return explain(backend, _sglang.api().ForwardMode.EXTEND)


# -- end of explain -------------------------------------------------------------------------


def _effective(backend: Any, smode: Any) -> Any:
    """What the patched ``shared_read_ends`` returns for (instance, sglang mode)."""
    return _sglang.ends_of(explain(backend, smode)[0])


def _store(backend: Any, key: str, gen: int, field_: Any, value: Any) -> None:
    with _lock:
        if gen != _gen:
            return  # plugins changed while this was resolved: never keep an older answer
        cached = backend.__dict__.get(key)
        if cached is None or cached[0] != gen:
            cached = (gen, {})
            backend.__dict__[key] = cached
            with contextlib.suppress(TypeError):  # a class without weak references
                _CACHED.add(backend)
        cached[1][field_] = value


def _make_shared_read_ends(original: Callable[..., Any]) -> Callable[..., Any]:
    def shared_read_ends(self: Any, fm: Any) -> Any:
        cached = self.__dict__.get(_SRE)
        if cached is not None and cached[0] == _gen:
            ends = cached[1].get(fm)
            if ends is not None:
                return ends
        if _sglang.in_tree_active() or _state is None:
            return original(self, fm)
        gen = _gen
        try:
            ends = _effective(self, fm)
        except Exception as exc:
            _log_once(
                ("failed", type(self), fm, repr(exc)),
                logging.ERROR,
                f"warcore-sglang: resolving {type(self).__qualname__}.shared_read_ends({fm}) "
                f"failed ({type(exc).__name__}: {exc}); UNKNOWN (coarse fence)",
            )
            return _sglang.api().SharedReadEnds.UNKNOWN
        _store(self, _SRE, gen, fm, ends)
        return ends

    return _wrap(shared_read_ends, original)


def _others(resolution: BoundaryResolution, ours: frozenset[str]) -> SharedReadBoundary:
    """The latest answer of plugins other than warcore-sglang in a resolution tree
    (``UNKNOWN`` if any of them failed or is stale); ``PRE_REPLAY`` when there is none."""
    found = [SharedReadBoundary.PRE_REPLAY]
    stack = [resolution]
    while stack:
        r = stack.pop()
        if r.failures or r.source.startswith(("stale:", "forced-coarse")):
            return SharedReadBoundary.UNKNOWN
        found += [b for plugin, b in r.answers if plugin not in ours]
        stack.extend(r.children)
    return latest(found)


def _prefill_decision(backend: Any) -> tuple[str | None, Any, Any]:
    """(why the prefill may not publish, None when it may; the static answer; the latest other
    plugin's answer)."""
    api = _sglang.api()
    pm = _pm()
    name, ctx = identify(backend)
    extend = ForwardMode.EXTEND
    closed: str | None = None
    if pm.config.force_coarse:
        closed = "forced-coarse"
    elif (veto := resolve_fast_path_veto(extend, ctx, pm=pm)).vetoed:
        closed = veto.source
    elif not (phase := resolve_war_publish_phase(ctx.algorithm, extend, pm=pm)).publishes:
        closed = f"not the publish phase ({phase.source})"
    static = backend.shared_read_ends(api.ForwardMode.EXTEND)
    others = SharedReadBoundary.PRE_REPLAY
    if name is not None:
        ours = _state.plugin_names if _state is not None else frozenset()
        others = _others(resolve_shared_read_boundary(name, extend, ctx, pm=pm), ours)
    return closed, static, _sglang.ends_of(others)


def _base_module() -> Any:
    """sglang's ``base_attn_backend`` (complete whenever a patched module has been imported:
    every one of them imports it; the constants come from it, not from a fresh import, so that
    patching inside an import chain never re-enters a half-imported module)."""
    return sys.modules[SRT + "layers.attention.base_attn_backend"]


def _make_resolve_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    base = _base_module()
    envs, ends_cls = base.envs, base.SharedReadEnds
    unknown, extend = ends_cls.UNKNOWN, base.ForwardMode.EXTEND

    def resolve_prefill_shared_read_ends(
        self: Any, forward_batch: Any, *, num_qo_tokens: int, build_snapshot: bool = True
    ) -> Any:
        if _state is None or _sglang.in_tree_active():
            return original(
                self, forward_batch, num_qo_tokens=num_qo_tokens, build_snapshot=build_snapshot
            )
        # sglang's own switches stay in force (read per call, as sglang does).
        if (
            envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get()
            or not envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.get()
            or forward_batch.forward_mode != extend
        ):
            return unknown
        cached = self.__dict__.get(_PREFILL)
        if cached is not None and cached[0] == _gen:
            decision = cached[1]["decision"]
        else:
            gen = _gen
            try:
                decision = _prefill_decision(self)
            except Exception as exc:
                _log_once(
                    ("prefill-failed", type(self), repr(exc)),
                    logging.ERROR,
                    f"warcore-sglang: the prefill decision of {type(self).__qualname__} failed "
                    f"({type(exc).__name__}: {exc}); UNKNOWN (coarse fence)",
                )
                return unknown
            _store(self, _PREFILL, gen, "decision", decision)
        closed, static, others = decision
        if closed is not None:
            return unknown
        if not build_snapshot:
            return static
        # The snapshot path: sglang's per-batch answer (it builds the batch's snapshot) stands
        # for sglang's own static one; another plugin's answer is never overruled.
        per_batch = type(self)._snapshot_prefill_shared_reads(
            self, forward_batch, num_qo_tokens=num_qo_tokens
        )
        return ends_cls.max_of([per_batch, others])

    return _wrap(resolve_prefill_shared_read_ends, original)


def _make_supports_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def supports_prefill_shared_read_done(self: Any) -> bool:
        if _state is None or _sglang.in_tree_active():
            return bool(original(self))
        answer = _PUBLISH.get(self)
        if answer is not None:
            return answer
        name = _sglang.warcore_algorithm(self)
        if name is None:
            return bool(original(self))
        gen = _gen
        answer = resolve_war_publish_phase(name, ForwardMode.EXTEND, pm=_pm()).publishes
        with _lock:
            if gen == _gen:
                _PUBLISH[self] = answer
        return answer

    return _wrap(supports_prefill_shared_read_done, original)


def _make_resolve_decode(original: Callable[..., Any]) -> Callable[..., Any]:
    ends_cls = _base_module().SharedReadEnds
    unknown, in_replay, post = ends_cls.UNKNOWN, ends_cls.IN_REPLAY, ends_cls.POST_REPLAY

    def slow(runner: Any, attn_backend: Any, forward_mode: Any) -> Any:
        if _state is None or _sglang.in_tree_active():
            return original(runner, attn_backend, forward_mode)
        gen = _gen
        planted = runner.in_graph_metadata_prep_done is not None
        ends = attn_backend.shared_read_ends(forward_mode)  # warcore's, through the patch
        if ends is in_replay and not planted:
            ends = post  # no in-graph marker (e.g. HIP): only a post-replay event covers it
        with _lock:
            if gen == _gen:
                _DECODE.setdefault(attn_backend, [{}, {}])[planted][forward_mode] = ends
        if ends is unknown:
            _clear(runner)
        return ends

    def _resolve_shared_read_ends(self: Any, attn_backend: Any, forward_mode: Any) -> Any:
        # The runner's last answer, while nothing changed (the same backend, mode and in-graph
        # event, the same generation): identity tests on one tuple, the cheapest Python answer
        # (python -m warcore_sglang.bench measures it against an empty method).
        try:
            backend, mode, event, gen, ends = self._warcore_sglang_last
            if (
                backend is attn_backend
                and mode is forward_mode
                and event is self.in_graph_metadata_prep_done
                and gen == _gen
            ):
                return ends
        except AttributeError:
            pass
        gen = _gen
        per = _DECODE.get(attn_backend)
        if per is not None:
            event = self.in_graph_metadata_prep_done
            ends = per[event is not None].get(forward_mode)
            if ends is not None:
                if ends is unknown:
                    _clear(self)  # a side effect on every call: never remembered
                else:
                    with contextlib.suppress(AttributeError, TypeError):  # __slots__, no weakref
                        self._warcore_sglang_last = (attn_backend, forward_mode, event, gen, ends)
                        _CACHED.add(self)
                return ends
        return slow(self, attn_backend, forward_mode)

    return _wrap(_resolve_shared_read_ends, original)


def _clear(runner: Any) -> None:
    """An UNKNOWN forward publishes nothing: no event an earlier phase left may stand for it."""
    model_runner = getattr(runner, "model_runner", None)
    if model_runner is not None:
        model_runner.shared_read_done_event = None


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
    name = _sglang.warcore_algorithm(algo if algo is not None else _process_algorithm())
    if name is None:
        return original_fget(worker)
    drafter = worker.__dict__.get("_draft_worker")
    facts = StepFacts(
        has_draft_model=drafter is not None,
        draft_extend_staged=bool(getattr(drafter, "last_draft_extend_staged", False)),
    )
    owner = get_decision_cache(_pm()).event_owner(name, facts).owner
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


def _make_owner_property(original: property) -> property:
    fget = original.fget
    assert fget is not None

    def last_shared_read_runner(self: Any) -> Any:
        if _state is None or _sglang.in_tree_active():
            return fget(self)
        try:
            return _owner_runner(self, fget)
        except Exception as exc:
            _log_once(
                ("owner-failed", type(self), repr(exc)),
                logging.ERROR,
                f"warcore-sglang: the event owner of {type(self).__qualname__} failed "
                f"({type(exc).__name__}: {exc}); no owner (coarse barrier)",
            )
            return _NO_EVENT

    patched = _PatchedProperty(last_shared_read_runner, original.fset, original.fdel)
    patched.__warcore_original__ = original
    return patched


def _make_builder(original: Callable[..., Any]) -> Callable[..., Any]:
    def _build_full_attention_backend_from_str(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        name = kwargs.get("backend_str")
        if isinstance(name, str) and _state is not None:
            with contextlib.suppress(Exception):
                wname = warcore_name(name)
                backend.__dict__[_sglang.TAG] = wname
                if _sglang.class_ref(wname) is None:  # an sglang plugin's backend: learn its class
                    _sglang.learn(wname, type(backend))
                    _invalidate()
        return backend

    return _wrap(_build_full_attention_backend_from_str, original)


def _make_scheduler_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        mode = os.environ.get(ENV_CHECK_RANKS, "").strip().lower()
        if _state is not None and (mode in _TRUE or mode == "warn"):
            _check_ranks(raise_on_mismatch=mode != "warn")

    return _wrap(__init__, original)


def _wrap(function: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(function, original)
    function.__warcore_original__ = original  # type: ignore[attr-defined]
    return function


# -- the rank check ------------------------------------------------------------------------


def rank_cells(pm: WarcorePluginManager | None = None) -> list[tuple[str, ForwardMode, Any]]:
    """The cells every rank of this server must decide alike: each sglang backend in the four
    publishing modes, under this process's algorithm and offload flags."""
    from warcore.core import get_registry

    pm = pm if pm is not None else _pm()
    name = _sglang.warcore_algorithm(_process_algorithm()) or "none"
    ctx = BoundaryContext(name, _offload_flags())
    modes = (
        ForwardMode.EXTEND,
        ForwardMode.DECODE,
        ForwardMode.TARGET_VERIFY,
        ForwardMode.DRAFT_EXTEND_V2,
    )
    backends = sorted(
        n for n, offer in get_registry(pm).backends.items() if offer.spec.engine == "sglang"
    )
    return [(b, m, ctx) for b in backends for m in modes]


def _check_ranks(*, raise_on_mismatch: bool) -> None:
    from warcore.audit.ranks import check_ranks_agree

    group = None
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_parallel

        group = get_parallel().world_group.cpu_group
    check_ranks_agree(group, rank_cells(), pm=_pm(), raise_on_mismatch=raise_on_mismatch)


# -- patching ------------------------------------------------------------------------------


def _set(owner: Any, attr: str, value: Any) -> None:
    state = _state
    assert state is not None
    state.patches.append(_Patch(owner, attr, vars(owner).get(attr, _MISSING)))
    setattr(owner, attr, value)


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        if klass not in out:
            out.append(klass)
            stack.extend(klass.__subclasses__())
    return out


def _patch_tree(base: type, attr: str, make: Callable[[Any], Any]) -> None:
    """Patch ``attr`` where ``base`` and each subclass defines it, now and for classes defined
    later (``base.__init_subclass__``)."""
    for cls in (base, *_subclasses(base)):
        if attr in vars(cls) and not hasattr(vars(cls)[attr], "__warcore_original__"):
            _set(cls, attr, make(vars(cls)[attr]))
    previous = vars(base).get("__init_subclass__", _MISSING)

    def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
        if previous is _MISSING:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        else:
            previous.__func__(cls, **kwargs)
        if _state is not None and attr in vars(cls):
            with _lock:
                _set(cls, attr, make(vars(cls)[attr]))

    existing = getattr(vars(base).get("__init_subclass__"), "__func__", None)
    if getattr(existing, "__warcore_attr__", None) == attr:
        return
    __init_subclass__.__warcore_attr__ = attr  # type: ignore[attr-defined]
    _set(base, "__init_subclass__", classmethod(__init_subclass__))


def _on_base_backend(module: ModuleType) -> None:
    backend = module.AttentionBackend
    _patch_tree(backend, "shared_read_ends", _make_shared_read_ends)
    _set(
        backend,
        "resolve_prefill_shared_read_ends",
        _make_resolve_prefill(vars(backend)["resolve_prefill_shared_read_ends"]),
    )


def _on_spec_info(module: ModuleType) -> None:
    algo = module.SpeculativeAlgorithm
    _set(
        algo,
        "supports_prefill_shared_read_done",
        _make_supports_prefill(vars(algo)["supports_prefill_shared_read_done"]),
    )


def _on_spec_registry(module: ModuleType) -> None:
    _patch_tree(module.CustomSpecAlgo, "supports_prefill_shared_read_done", _make_supports_prefill)


def _on_decode_runner(module: ModuleType) -> None:
    _patch_tree(module.DecodeCudaGraphRunner, "_resolve_shared_read_ends", _make_resolve_decode)


def _on_spec_worker(module: ModuleType) -> None:
    _patch_tree(module.BaseSpecWorker, "last_shared_read_runner", _make_owner_property)


def _on_tp_worker(module: ModuleType) -> None:
    _patch_tree(module.BaseTpWorker, "last_shared_read_runner", _make_owner_property)


def _on_backend_setup(module: ModuleType) -> None:
    name = "_build_full_attention_backend_from_str"
    _set(module, name, _make_builder(vars(module)[name]))


def _on_scheduler(module: ModuleType) -> None:
    scheduler = module.Scheduler
    _set(scheduler, "__init__", _make_scheduler_init(vars(scheduler)["__init__"]))


_WATCH: dict[str, Callable[[ModuleType], None]] = {
    SRT + "layers.attention.base_attn_backend": _on_base_backend,
    SRT + "speculative.spec_info": _on_spec_info,
    SRT + "speculative.spec_registry": _on_spec_registry,
    SRT + "model_executor.runner.decode_cuda_graph_runner": _on_decode_runner,
    SRT + "speculative.base_spec_worker": _on_spec_worker,
    SRT + "managers.tp_worker": _on_tp_worker,
    SRT + "model_executor.model_runner_components.attention_backend_setup": _on_backend_setup,
}
_SCHEDULER = SRT + "managers.scheduler"


def _apply(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    with _lock:
        if _state is None:
            return
        try:
            callback(module)
        except Exception:
            logger.exception(
                "warcore-sglang: patching %s failed; its declaration points keep sglang's own "
                "answers",
                module.__name__,
            )


# -- install / uninstall -------------------------------------------------------------------


def is_installed() -> bool:
    return _state is not None


def install(*, check_ranks: bool | None = None) -> None:
    """Make sglang's declaration points in this process answer through warcore (idempotent).

    Patches what is imported now and, through a post-import hook, each watched module when it
    is imported later. ``check_ranks`` (default: ``WARCORE_SGLANG_CHECK_RANKS``) also runs the
    rank check at the end of every ``Scheduler.__init__``. Raises
    :class:`UnsupportedSglangError` when the installed sglang is outside
    ``warcore_sglang.SUPPORTED`` (nothing is patched).
    """
    global _state
    with _lock:
        if _state is not None:
            return
        reason = _sglang.unsupported_reason()
        if reason is not None:
            raise UnsupportedSglangError(
                f"warcore-sglang will not patch this sglang: {reason} (its declarations were "
                "read from that release's code; another release may declare differently)"
            )
        pm = get_plugin_manager()
        state = _State(pm=pm, plugin_names=_sglang_plugin_names(pm))
        _state = state
        _invalidate()
        pm.add_change_listener(_on_change)
        if not state.plugin_names:
            logger.warning(
                "warcore-sglang: warcore's plugin 'sglang' is not loaded (WARCORE_PLUGINS or "
                "WARCORE_DISABLE_PLUGINS?): sglang's own declarations are not among warcore's "
                "answers; each answer stays at least sglang's own for the instance"
            )
        watch = dict(_WATCH)
        if check_ranks is None:
            flag = os.environ.get(ENV_CHECK_RANKS, "").strip().lower()
            check_ranks = flag in _TRUE or flag == "warn"
        if check_ranks:
            watch[_SCHEDULER] = _on_scheduler
        pending = {name: cb for name, cb in watch.items() if name not in sys.modules}
        state.finder = PostImportFinder(
            {name: functools.partial(_apply, cb) for name, cb in pending.items()}
        )
        sys.meta_path.insert(0, state.finder)
        try:
            for name, callback in watch.items():
                module = sys.modules.get(name)
                if module is not None:
                    callback(module)
        except Exception:
            _restore(state)
            _state = None
            raise
    logger.info(
        "warcore-sglang: active in process %d (sglang %s; warcore resolves its declaration points)",
        os.getpid(),
        _sglang.installed_version(),
    )


def _restore(state: _State) -> None:
    if state.finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(state.finder)
    for patch in reversed(state.patches):
        if patch.original is _MISSING:
            with contextlib.suppress(AttributeError):
                delattr(patch.owner, patch.attr)
        else:
            setattr(patch.owner, patch.attr, patch.original)
    state.patches.clear()
    with contextlib.suppress(ValueError, AttributeError):
        state.pm.remove_change_listener(_on_change)


def uninstall() -> None:
    """Restore every attribute :func:`install` patched (the very objects sglang defined) and
    remove the post-import hook; cached answers are dropped (idempotent)."""
    global _state
    with _lock:
        state = _state
        if state is None:
            return
        _restore(state)
        _state = None
        _invalidate()
        for backend in list(_CACHED):
            backend.__dict__.pop(_SRE, None)
            backend.__dict__.pop(_PREFILL, None)
            backend.__dict__.pop(_LAST, None)
        _CACHED.clear()
    logger.info("warcore-sglang: uninstalled from process %d", os.getpid())


def sglang_plugin() -> None:
    """sglang's plugin entry point (group ``sglang.srt.plugins``): activate when
    ``WARCORE_SGLANG=1``, and log the process's start-up line. Never raises. The entry point
    itself is :func:`warcore_sglang._entry.sglang_plugin` (it imports no ``warcore`` before it
    knows whether the package is shadowed); this name stays for callers of 0.1.0."""
    from ._entry import sglang_plugin as entry

    entry()
