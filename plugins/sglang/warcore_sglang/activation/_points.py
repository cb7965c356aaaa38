"""The patched declaration points: sglang's own answer, warcore's, the bound; each once.

Each ``make_*`` takes the attribute sglang defined and returns its replacement, which reads
down one way:

1. while the activation is off, or the oracle asks sglang (``oracle.in_tree()``): sglang's
   original, and nothing else;
2. sglang's own answer for this very call: the original, called with the arguments as given,
   under ``in_tree()`` (so what it asks of other patched points is sglang's own too), on every
   call (0.5.21's and 0.5.22's dsv4 declares per batch);
3. warcore's answer (:func:`._answers.ours`, remembered on the instance: the plugins'
   declarations for the backend's warcore name, its vetoes, force-coarse, the publish phase);
4. :func:`._answers.bound`, the later of the two: warcore can only make a decision later (or
   coarse), never earlier than sglang would make it on the same call.

A failure in step 3 never reaches sglang: it is logged once and answered UNKNOWN (a coarse
fence). The decode runner asks on every ``execute``, so its bounded answer is remembered per
runner (its last mode by identity, then one dict lookup; ``python -m
warcore_sglang.serving.bench`` measures it against an empty method), taken off whenever
warcore's plugins or switches change or the runner plants its in-graph event.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Callable
from typing import Any

from warcore import ForwardMode
from warcore.core import resolve_war_publish_phase
from warcore.integration.patching import wrap

from ..declarations import oracle
from ..declarations.names import TAG, warcore_name
from ..settings import DEFAULT
from . import _state
from ._answers import bound, ours, prefill_decision, prefill_opt_out, sglang_ends
from ._state import CACHED, ENDS, FAST, MODE, TABLE


def _unknown(key: tuple[Any, ...], what: str, exc: Exception) -> Any:
    _state.log_failure(key, what, exc, "UNKNOWN (coarse fence)")
    return sglang_ends().UNKNOWN


# -- a backend's declaration ----------------------------------------------------------------


def make_shared_read_ends(original: Callable[..., Any]) -> Callable[..., Any]:
    tree = oracle.TREE

    def shared_read_ends(self: Any, fm: Any) -> Any:
        # sglang's own code asking (the prefill resolver's body, on every batch) first:
        # this thread's depth read inline, a call and two module lookups fewer
        here = getattr(tree, "here", None)
        if (here is not None and here.depth) or _state.current is None:
            return original(self, fm)
        own = oracle.own(original, self, fm)
        try:
            return bound(own, ours(self, fm))
        except Exception as exc:
            mode = getattr(fm, "name", fm)  # sglang's ForwardMode is an IntEnum: its name
            what = f"resolving {type(self).__qualname__}.shared_read_ends({mode})"
            return _unknown(("failed", type(self), fm), what, exc)

    return wrap(shared_read_ends, original)


# -- the prefill: per batch -----------------------------------------------------------------


def _prefill_mine(backend: Any, snapshot: bool) -> Any:
    """warcore's answer for a prefill batch of ``backend`` (``snapshot``: sglang's answer is
    its per-batch refinement of its own static one, which then stands for it; the other
    plugins' answers still bound it): remembered on the backend, but under
    ``WARCORE_SGLANG_PREFILL_SWITCH=main``, whose opt-out is read per batch as sglang reads its
    own switch."""
    state = _state.current
    if state is not None and state.prefill_switch != DEFAULT:
        if not prefill_opt_out().on:
            return sglang_ends().UNKNOWN
        return _prefill_static(backend, snapshot)
    key = _SNAPSHOT if snapshot else _STATIC
    return _state.cached(backend, key, lambda: _prefill_static(backend, snapshot))


_SNAPSHOT, _STATIC = "prefill-snapshot", "prefill-static"


def _prefill_static(backend: Any, snapshot: bool) -> Any:
    closed, static, others = prefill_decision(backend)
    if closed is not None:
        return sglang_ends().UNKNOWN
    return others if snapshot else static


def make_resolve_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    """sglang 0.5.23's ``resolve_prefill_shared_read_ends``: its gates, switches and per-batch
    snapshot as shipped, bounded. Once per prefill batch, in a scheduler whose caches hold the
    forward's data, where each line read cold costs (measured with ``WARCORE_SGLANG_METER``,
    about 1 µs a line): :func:`oracle.own`, the cache read and :func:`bound` are written
    inline, and whether the activation is on is asked only on a miss (its answers are taken
    off every backend with it).

    This thread's :class:`oracle.Depth` is the one the last caller's thread had, when this is
    that thread (its ident, one C call): a ``threading.local`` read finds the thread's dict,
    the local's entry and then the attribute, each cold here (1.3-1.6 µs a batch, against the
    meter's same-site control, BENCHMARKS.md). The pair is one tuple, read and rebound whole.
    Should a thread end and a new one get its ident, this point and the points it calls would
    read different depths: each then takes warcore's bounded path where it could have taken
    sglang's, a later answer, never an earlier one."""
    getattribute, cache, ident = object.__getattribute__, _state.CACHE, threading.get_ident
    last: tuple[int | None, oracle.Depth | None] = (None, None)

    def resolve_prefill_shared_read_ends(
        self: Any, forward_batch: Any, *args: Any, **kw: Any
    ) -> Any:
        nonlocal last
        thread, here = last
        me = ident()
        if here is None or me != thread:
            here = oracle.depth()
            last = (me, here)
        if here.depth:
            return original(self, forward_batch, *args, **kw)
        here.depth = 1
        try:
            own = original(self, forward_batch, *args, **kw)
        finally:
            here.depth = 0
        try:  # warcore's answer: only there while the activation is on (taken off with it)
            mine = getattribute(self, cache)[
                _SNAPSHOT if kw.get("build_snapshot", True) else _STATIC
            ]
        except (AttributeError, KeyError):
            mine = _prefill_miss(self, kw.get("build_snapshot", True))
            if mine is None:
                return own
        if own is mine:
            return own
        return own if own._value_ >= mine._value_ else mine

    return wrap(resolve_prefill_shared_read_ends, original)


def _prefill_miss(backend: Any, snapshot: bool) -> Any:
    """warcore's prefill answer where the backend holds none yet: ``None`` while the activation
    is off (sglang's own answer stands), UNKNOWN (logged once) where computing it failed."""
    if _state.current is None:
        return None
    try:
        return _prefill_mine(backend, snapshot)
    except Exception as exc:
        what = f"the prefill decision of {type(backend).__qualname__}"
        return _unknown(("prefill-failed", type(backend)), what, exc)


def make_prefill_publisher(original: Callable[..., Any]) -> Callable[..., Any]:
    """sglang 0.5.21's and 0.5.22's ``maybe_publish_prefill_shared_read_done(model_runner,
    forward_batch, device_module)``, which decides and publishes in one: sglang's own decision
    runs (its opt-in, the mode, the backend's live declaration for this batch, the algorithm);
    an event it published stays only if warcore's answer for the batch is PRE_REPLAY too, else
    the mailbox is emptied (a coarse barrier). warcore never publishes where sglang did not."""

    def maybe_publish_prefill_shared_read_done(
        model_runner: Any, forward_batch: Any, device_module: Any
    ) -> Any:
        if _state.current is None or oracle.in_tree_active():
            return original(model_runner, forward_batch, device_module)
        before = model_runner.shared_read_done_event
        result = oracle.own(original, model_runner, forward_batch, device_module)
        published = model_runner.shared_read_done_event
        if published is None or published is before:
            return result  # sglang published nothing: nothing to bound
        backend = model_runner.attn_backend
        try:
            keep = _prefill_mine(backend, snapshot=True) is sglang_ends().PRE_REPLAY
        except Exception as exc:
            _unknown(("publisher-failed", type(backend)), "the prefill publish decision", exc)
            keep = False
        if not keep:
            model_runner.shared_read_done_event = None
        return result

    return wrap(maybe_publish_prefill_shared_read_done, original)


def make_supports_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def supports_prefill_shared_read_done(self: Any) -> bool:
        own = bool(original(self))
        if not own or _state.current is None or oracle.in_tree_active():
            return own  # sglang's own "no" is never turned into a "yes"
        try:
            return object.__getattribute__(self, _state.CACHE)[_PUBLISHES]  # type: ignore[no-any-return]
        except (AttributeError, KeyError):
            return _state.cached(self, _PUBLISHES, lambda: _publishes(self, own))

    return wrap(supports_prefill_shared_read_done, original)


_PUBLISHES = "publishes"


def _publishes(algo: Any, own: bool) -> bool:
    name = oracle.warcore_algorithm(algo)
    if name is None:
        return own
    return resolve_war_publish_phase(name, ForwardMode.EXTEND, pm=_state.pm()).publishes


# -- the decode runner: on every replay -----------------------------------------------------


def make_resolve_decode(original: Callable[..., Any]) -> Callable[..., Any]:
    """sglang's decode runner gets :func:`_resolve_shared_read_ends` itself, which closes over
    nothing: a closure's cell costs about 3 ns a replay on this path, a fifth of the lookup's
    budget over an empty method. So it is bound once, to the first original it replaces, and
    reaches that original through its own name; any other (a subclass defining its own, a
    runner class of a reloaded module) gets the same code, its miss bound to that original in
    a copy of this module's globals (the same lookup, written once)."""
    if vars(_resolve_shared_read_ends).get(ORIGINAL, original) is original:
        return wrap(_resolve_shared_read_ends, original)

    def miss(runner: Any, backend: Any, mode: Any) -> Any:
        return _decode(runner, backend, mode, original)

    code = _resolve_shared_read_ends.__code__
    resolve = types.FunctionType(code, {**globals(), _decode_miss.__name__: miss})
    return wrap(resolve, original)


ORIGINAL = "__warcore_original__"


def _resolve_shared_read_ends(self: Any, attn_backend: Any, forward_mode: Any) -> Any:
    # The runner's bounded answers for its own backend: its last mode by identity, then by
    # mode in one dict. Only a runner that always passes its own backend has them (not pdmux;
    # the gate checks that sglang sets the backend once and passes it). An UNKNOWN is never
    # there: it clears the mailbox on every replay.
    try:
        if forward_mode is self._warcore_sglang_mode:
            return self._warcore_sglang_ends
        return self._warcore_sglang_fast[forward_mode]
    except (AttributeError, KeyError):
        return _decode_miss(self, attn_backend, forward_mode)  # no local here: each costs


def _decode_miss(runner: Any, backend: Any, mode: Any) -> Any:
    return _decode(runner, backend, mode, vars(_resolve_shared_read_ends)[ORIGINAL])


def _decode(runner: Any, backend: Any, mode: Any, original: Callable[..., Any]) -> Any:
    if _state.current is None or oracle.in_tree_active():
        return original(runner, backend, mode)
    ends = sglang_ends()
    table = getattr(runner, TABLE, None)
    found = table.get(backend, {}).get(mode) if table is not None else None
    if found is None:
        tag = _state.tag()
        own = oracle.own(original, runner, backend, mode)  # sglang's, its demotion included
        try:
            mine = ours(backend, mode)
            if mine is ends.IN_REPLAY and runner.in_graph_metadata_prep_done is None:
                mine = ends.POST_REPLAY  # no in-graph event: only a post-replay one covers it
            found = bound(own, mine)
        except Exception as exc:
            found = _unknown(("decode-failed", type(backend)), "the decode decision", exc)
        _remember(runner, backend, mode, found, tag)
    if found is ends.UNKNOWN:
        _clear(runner)
    return found


def _remember(runner: Any, backend: Any, mode: Any, ends: Any, tag: tuple[int, int]) -> None:
    # getattr and setattr, never the instance's __dict__: reading it turns the object's
    # attributes into a plain dict, and every attribute read on the replay path gets slower
    unknown = sglang_ends().UNKNOWN
    with _state.lock:
        if tag != _state.tag():
            return
        try:
            CACHED.add(runner)  # invalidation must be able to find it: no weakref, no cache
        except TypeError:
            return
        table = getattr(runner, TABLE, None)
        if table is None:
            table = {}
            setattr(runner, TABLE, table)
        per = table.setdefault(backend, {})
        per[mode] = ends
        own_backend = getattr(runner, "attn_backend", None)
        if backend is own_backend and not getattr(runner, "enable_pdmux", False):
            setattr(runner, FAST, {m: e for m, e in per.items() if e is not unknown})
            if ends is not unknown:
                setattr(runner, ENDS, ends)
                setattr(runner, MODE, mode)


def _clear(runner: Any) -> None:
    """An UNKNOWN forward publishes nothing: no event an earlier phase left may stand for it."""
    model_runner = getattr(runner, "model_runner", None)
    if model_runner is not None:
        model_runner.shared_read_done_event = None


def make_record_marker(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_record_in_graph_metadata_prep_done`` (where the runner plants its in-graph event):
    the runner's remembered answers depend on whether it has one, so they are forgotten."""

    def _record_in_graph_metadata_prep_done(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            _state.forget(self, _state.RUNNER)

    return wrap(_record_in_graph_metadata_prep_done, original)


# -- the registry builder -------------------------------------------------------------------


def make_builder(original: Callable[..., Any]) -> Callable[..., Any]:
    def _build_full_attention_backend_from_str(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        name = kwargs.get("backend_str")
        if isinstance(name, str) and _state.current is not None:
            with contextlib.suppress(Exception):
                wname = warcore_name(name)
                setattr(backend, TAG, wname)
                if oracle.class_ref(wname) is None:  # an sglang plugin's backend: its class
                    oracle.learn(wname, type(backend))
                    _state.invalidate()
        return backend

    return wrap(_build_full_attention_backend_from_str, original)
