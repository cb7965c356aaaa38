"""The patched declaration points: sglang's own answer first, then warcore's, then the bound.

Each ``make_*`` takes the attribute sglang defined and returns its replacement, which reads
down one way:

1. while the activation is off, or the oracle asks sglang (``_sglang.in_tree()``): sglang's
   original, and nothing else;
2. sglang's own answer for this very call: the original, called with the arguments as given,
   under ``in_tree()`` (so what it asks of other patched points is sglang's own too);
3. warcore's answer (:mod:`._answers`: the plugins' declarations for the backend's warcore
   name, its vetoes, force-coarse, the publish phase);
4. the bound: the later of the two (``SharedReadEnds.max_of``). warcore can only make a
   decision later (or coarse), never earlier than sglang would make it on the same call.

A failure in step 3 never reaches sglang: it is logged once and answered UNKNOWN (a coarse
fence). The decode runner asks on every ``execute``, so its answer is remembered per runner:
one attribute read and one dict lookup (``python -m warcore_sglang.bench`` measures it against
an empty method), forgotten whenever warcore's plugins or switches change or the runner plants
its in-graph event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from warcore import ForwardMode
from warcore.core import resolve_war_publish_phase

from .. import _sglang
from .._names import TAG, warcore_name
from . import _state
from ._answers import base_module, decide_ends, prefill_decision, prefill_opt_out
from ._machinery import wrap
from ._state import CACHED, FAST, PREFILL, PUBLISH, SRE, TABLE


def _store(holder: Any, key: str, gen: int, field_: Any, value: Any) -> None:
    with _state.lock:
        if gen != _state.gen:
            return  # plugins changed while this was resolved: never keep an older answer
        cached = holder.__dict__.get(key)
        if cached is None or cached[0] != gen:
            cached = (gen, {})
            holder.__dict__[key] = cached
            with contextlib.suppress(TypeError):  # a class without weak references
                CACHED.add(holder)
        cached[1][field_] = value


def _later(own: Any, ours: Any) -> Any:
    return base_module().SharedReadEnds.max_of([own, ours])


# -- a backend's declaration ----------------------------------------------------------------


def make_shared_read_ends(original: Callable[..., Any]) -> Callable[..., Any]:
    def shared_read_ends(self: Any, fm: Any) -> Any:
        if _state.current is None or _sglang.in_tree_active():
            return original(self, fm)
        cached = self.__dict__.get(SRE)
        if cached is not None and cached[0] == _state.gen:
            ends = cached[1].get(fm)
            if ends is not None:
                return ends
        gen = _state.gen
        own = _sglang.own(original, self, fm)
        try:
            ends = decide_ends(self, fm, own)  # warcore's answer, never earlier than own
        except Exception as exc:
            mode = getattr(fm, "name", fm)  # sglang's ForwardMode is an IntEnum: its name
            what = f"resolving {type(self).__qualname__}.shared_read_ends({mode})"
            _state.log_failure(("failed", type(self), fm), what, exc, "UNKNOWN (coarse fence)")
            return base_module().SharedReadEnds.UNKNOWN
        _store(self, SRE, gen, fm, ends)
        return ends

    return wrap(shared_read_ends, original)


# -- the prefill: per batch -----------------------------------------------------------------


def make_resolve_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_prefill_shared_read_ends(
        self: Any, forward_batch: Any, *args: Any, **kw: Any
    ) -> Any:
        if _state.current is None or _sglang.in_tree_active():
            return original(self, forward_batch, *args, **kw)
        # sglang's gates, switches and per-batch snapshot, as shipped
        own = _sglang.own(original, self, forward_batch, *args, **kw)
        try:
            return _later(own, _prefill_ends(self, own, kw.get("build_snapshot", True)))
        except Exception as exc:
            what = f"the prefill decision of {type(self).__qualname__}"
            _state.log_failure(("prefill-failed", type(self)), what, exc, "UNKNOWN (coarse fence)")
            return base_module().SharedReadEnds.UNKNOWN

    return wrap(resolve_prefill_shared_read_ends, original)


def _prefill_ends(backend: Any, own: Any, snapshot: bool) -> Any:
    """warcore's answer for a prefill batch sglang answered ``own`` for."""
    unknown = base_module().SharedReadEnds.UNKNOWN
    if own is unknown or not prefill_opt_out().on:
        return unknown
    cached = backend.__dict__.get(PREFILL)
    if cached is not None and cached[0] == _state.gen:
        decision = cached[1]["decision"]
    else:
        gen = _state.gen
        decision = prefill_decision(backend)
        _store(backend, PREFILL, gen, "decision", decision)
    closed, static, others = decision
    if closed is not None:
        return unknown
    # The snapshot path: sglang's per-batch answer stands for sglang's own static one, which
    # it refines (dsv4 snapshots the batch's page table); another plugin's answer still bounds
    # it. The static path: warcore's static answer.
    return others if snapshot else static


def make_supports_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def supports_prefill_shared_read_done(self: Any) -> bool:
        own = bool(original(self))
        if not own or _state.current is None or _sglang.in_tree_active():
            return own  # sglang's own "no" is never turned into a "yes"
        answer = PUBLISH.get(self)
        if answer is not None:
            return answer
        name = _sglang.warcore_algorithm(self)
        if name is None:
            return own
        gen = _state.gen
        answer = resolve_war_publish_phase(name, ForwardMode.EXTEND, pm=_state.pm()).publishes
        with _state.lock:
            if gen == _state.gen:
                PUBLISH[self] = answer
        return answer

    return wrap(supports_prefill_shared_read_done, original)


# -- the decode runner: on every replay -----------------------------------------------------


def make_resolve_decode(original: Callable[..., Any]) -> Callable[..., Any]:
    def _resolve_shared_read_ends(self: Any, attn_backend: Any, forward_mode: Any) -> Any:
        # The runner's answers for its own backend, by mode: one dict lookup. Only a runner
        # that always passes its own backend has them (not pdmux; the gate checks that sglang
        # sets the backend once and passes it: _shape.check_runner_class). An UNKNOWN is never
        # there: it clears the mailbox on every replay.
        try:
            return self._warcore_sglang_fast[forward_mode]
        except (AttributeError, KeyError):
            return _decode(self, attn_backend, forward_mode, original)

    return wrap(_resolve_shared_read_ends, original)


def _decode(runner: Any, backend: Any, mode: Any, original: Callable[..., Any]) -> Any:
    if _state.current is None or _sglang.in_tree_active():
        return original(runner, backend, mode)
    unknown = base_module().SharedReadEnds.UNKNOWN
    table = getattr(runner, TABLE, None)
    ends = table.get(backend, {}).get(mode) if table is not None else None
    if ends is None:
        gen = _state.gen
        own = _sglang.own(original, runner, backend, mode)
        try:
            ends = _later(own, backend.shared_read_ends(mode))  # warcore's, through its patch
        except Exception as exc:
            what = f"the decode decision of {type(runner).__qualname__}"
            _state.log_failure(("decode-failed", type(backend)), what, exc, "UNKNOWN (coarse)")
            ends = unknown
        _remember(runner, backend, mode, ends, gen)
    if ends is unknown:
        _clear(runner)
    return ends


def _remember(runner: Any, backend: Any, mode: Any, ends: Any, gen: int) -> None:
    # getattr and setattr, never the instance's __dict__: reading it turns the object's
    # attributes into a plain dict, and every attribute read on the replay path gets slower
    unknown = base_module().SharedReadEnds.UNKNOWN
    with _state.lock:
        if gen != _state.gen:
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
            _state.forget(self, (FAST, TABLE))

    return wrap(_record_in_graph_metadata_prep_done, original)


# -- the registry builder -------------------------------------------------------------------


def make_builder(original: Callable[..., Any]) -> Callable[..., Any]:
    def _build_full_attention_backend_from_str(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        name = kwargs.get("backend_str")
        if isinstance(name, str) and _state.current is not None:
            with contextlib.suppress(Exception):
                wname = warcore_name(name)
                backend.__dict__[TAG] = wname
                if _sglang.class_ref(wname) is None:  # an sglang plugin's backend: learn its class
                    _sglang.learn(wname, type(backend))
                    _state.invalidate()
        return backend

    return wrap(_build_full_attention_backend_from_str, original)
