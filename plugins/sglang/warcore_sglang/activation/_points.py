"""The patched declaration points: sglang's methods, answering through warcore.

Each ``make_*`` takes the attribute sglang defined and returns its replacement. Every
replacement passes through to sglang's own code while the activation is off or the oracle asks
sglang (``_sglang.in_tree()``), and otherwise returns :mod:`._answers`' answer, cached: per
instance (keyed by the generation, :mod:`._state`) and, for the decode runner that asks on every
``execute``, as one identity-compared tuple (``python -m warcore_sglang.bench`` measures it
against sglang's own resolution). A failure inside never reaches sglang: it is logged once and
answered UNKNOWN (a coarse fence, never a less safe one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from warcore import ForwardMode
from warcore.core import resolve_war_publish_phase

from .. import _sglang
from .._names import warcore_name
from . import _state
from ._answers import base_module, effective, prefill_decision, prefill_switch
from ._machinery import wrap
from ._state import CACHED, DECODE, PREFILL, PUBLISH, SRE


def _store(backend: Any, key: str, gen: int, field_: Any, value: Any) -> None:
    with _state.lock:
        if gen != _state.gen:
            return  # plugins changed while this was resolved: never keep an older answer
        cached = backend.__dict__.get(key)
        if cached is None or cached[0] != gen:
            cached = (gen, {})
            backend.__dict__[key] = cached
            with contextlib.suppress(TypeError):  # a class without weak references
                CACHED.add(backend)
        cached[1][field_] = value


def make_shared_read_ends(original: Callable[..., Any]) -> Callable[..., Any]:
    def shared_read_ends(self: Any, fm: Any) -> Any:
        cached = self.__dict__.get(SRE)
        if cached is not None and cached[0] == _state.gen:
            ends = cached[1].get(fm)
            if ends is not None:
                return ends
        if _sglang.in_tree_active() or _state.current is None:
            return original(self, fm)
        gen = _state.gen
        try:
            ends = effective(self, fm)
        except Exception as exc:
            what = f"resolving {type(self).__qualname__}.shared_read_ends({fm})"
            _state.log_failure(("failed", type(self), fm), what, exc, "UNKNOWN (coarse fence)")
            return _sglang.api().SharedReadEnds.UNKNOWN
        _store(self, SRE, gen, fm, ends)
        return ends

    return wrap(shared_read_ends, original)


def make_resolve_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    base = base_module()
    envs, ends_cls = base.envs, base.SharedReadEnds
    unknown, extend = ends_cls.UNKNOWN, base.ForwardMode.EXTEND

    def resolve_prefill_shared_read_ends(
        self: Any, forward_batch: Any, *, num_qo_tokens: int, build_snapshot: bool = True
    ) -> Any:
        if _state.current is None or _sglang.in_tree_active():
            return original(
                self, forward_batch, num_qo_tokens=num_qo_tokens, build_snapshot=build_snapshot
            )
        # sglang's own switches stay in force (read per call, as sglang does).
        if envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get() or not prefill_switch(envs).on:
            return unknown
        if forward_batch.forward_mode != extend:
            return unknown
        cached = self.__dict__.get(PREFILL)
        if cached is not None and cached[0] == _state.gen:
            decision = cached[1]["decision"]
        else:
            gen = _state.gen
            try:
                decision = prefill_decision(self)
            except Exception as exc:
                what = f"the prefill decision of {type(self).__qualname__}"
                _state.log_failure(
                    ("prefill-failed", type(self)), what, exc, "UNKNOWN (coarse fence)"
                )
                return unknown
            _store(self, PREFILL, gen, "decision", decision)
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

    return wrap(resolve_prefill_shared_read_ends, original)


def make_supports_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def supports_prefill_shared_read_done(self: Any) -> bool:
        if _state.current is None or _sglang.in_tree_active():
            return bool(original(self))
        answer = PUBLISH.get(self)
        if answer is not None:
            return answer
        name = _sglang.warcore_algorithm(self)
        if name is None:
            return bool(original(self))
        gen = _state.gen
        answer = resolve_war_publish_phase(name, ForwardMode.EXTEND, pm=_state.pm()).publishes
        with _state.lock:
            if gen == _state.gen:
                PUBLISH[self] = answer
        return answer

    return wrap(supports_prefill_shared_read_done, original)


def make_resolve_decode(original: Callable[..., Any]) -> Callable[..., Any]:
    ends_cls = base_module().SharedReadEnds
    unknown, in_replay, post = ends_cls.UNKNOWN, ends_cls.IN_REPLAY, ends_cls.POST_REPLAY

    def slow(runner: Any, attn_backend: Any, forward_mode: Any) -> Any:
        if _state.current is None or _sglang.in_tree_active():
            return original(runner, attn_backend, forward_mode)
        gen = _state.gen
        planted = runner.in_graph_metadata_prep_done is not None
        ends = attn_backend.shared_read_ends(forward_mode)  # warcore's, through the patch
        if ends is in_replay and not planted:
            ends = post  # no in-graph marker (e.g. HIP): only a post-replay event covers it
        with _state.lock:
            if gen == _state.gen:
                DECODE.setdefault(attn_backend, [{}, {}])[planted][forward_mode] = ends
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
                and gen == _state.gen
            ):
                return ends
        except AttributeError:
            pass
        gen = _state.gen
        per = DECODE.get(attn_backend)
        if per is not None:
            event = self.in_graph_metadata_prep_done
            ends = per[event is not None].get(forward_mode)
            if ends is not None:
                if ends is unknown:
                    _clear(self)  # a side effect on every call: never remembered
                else:
                    with contextlib.suppress(AttributeError, TypeError):  # __slots__, no weakref
                        self._warcore_sglang_last = (attn_backend, forward_mode, event, gen, ends)
                        CACHED.add(self)
                return ends
        return slow(self, attn_backend, forward_mode)

    return wrap(_resolve_shared_read_ends, original)


def _clear(runner: Any) -> None:
    """An UNKNOWN forward publishes nothing: no event an earlier phase left may stand for it."""
    model_runner = getattr(runner, "model_runner", None)
    if model_runner is not None:
        model_runner.shared_read_done_event = None


def make_builder(original: Callable[..., Any]) -> Callable[..., Any]:
    def _build_full_attention_backend_from_str(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        name = kwargs.get("backend_str")
        if isinstance(name, str) and _state.current is not None:
            with contextlib.suppress(Exception):
                wname = warcore_name(name)
                backend.__dict__[_sglang.TAG] = wname
                if _sglang.class_ref(wname) is None:  # an sglang plugin's backend: learn its class
                    _sglang.learn(wname, type(backend))
                    _state.invalidate()
        return backend

    return wrap(_build_full_attention_backend_from_str, original)
