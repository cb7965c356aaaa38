"""warcore's answer for a live backend, the one bound, and the provenance reports give.

A patched point asks sglang's own code for the call it is in, then warcore's answer for the
instance (:func:`ours`: the plugins' declarations for its warcore name and context, closed by a
veto, force-coarse, the ranks or a phase that does not publish), then takes :func:`bound`, the
later of the two. warcore's answer depends only on the instance and the plugin set, so it is
remembered on the instance (:func:`warcore_sglang.activation._state.cached`); sglang's is asked
on every call. The trace and the sanitizer report :func:`explain` / :func:`explain_prefill`, the
same decision with its provenance.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from warcore import ForwardMode, SharedReadBoundary, latest
from warcore.core import (
    BoundaryContext,
    BoundaryResolution,
    WarcorePluginManager,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)

from ..declarations import oracle
from ..declarations.names import SRT
from ..settings import DEFAULT, PrefillSwitch, read_prefill_switch
from . import _state
from ._identity import identify

UNKNOWN = SharedReadBoundary.UNKNOWN


def sglang_ends() -> Any:
    """sglang's ``SharedReadEnds`` (its module is complete whenever a patched module has been
    imported: every one of them imports it; taken from ``sys.modules``, never a fresh import,
    so that patching inside an import chain never re-enters a half-imported module)."""
    return sys.modules[SRT + "layers.attention.base_attn_backend"].SharedReadEnds


def envs() -> Any:
    """sglang's ``srt.environ.envs`` (a watched module: imported before anything is patched)."""
    return sys.modules[SRT + "environ"].envs


def bound(own: Any, ours: Any) -> Any:
    """The later of sglang's own ``SharedReadEnds`` and warcore's (``None``: warcore has no
    answer of its own): never earlier than sglang. (``_value_``: an Enum member's value as a
    plain attribute; ``.value`` is a descriptor call.)"""
    if ours is None or own._value_ >= ours._value_:
        return own
    return ours


def _closed(
    name: str | None, mode: ForwardMode, ctx: BoundaryContext, pm: WarcorePluginManager
) -> str | None:
    """Why warcore keeps the coarse fence for backend ``name`` in ``mode`` under ``ctx``
    whatever is declared (force-coarse, the ranks disagreeing on it, a veto, not the publish
    phase), or ``None``."""
    if pm.config.force_coarse:
        return "forced-coarse"
    state = _state.current
    if state is not None and ("*" in state.coarse or (name, mode) in state.coarse):
        return "ranks disagree (WARCORE_SGLANG_CHECK_RANKS=warn)"
    veto = resolve_fast_path_veto(mode, ctx, pm=pm)
    if veto.vetoed:
        return veto.source
    # EXTEND's gate is the algorithm's (its patched supports_prefill_shared_read_done, and
    # prefill_decision); no other sglang runner gates on the algorithm, so a phase that does
    # not publish is UNKNOWN.
    if mode is not ForwardMode.EXTEND:
        return _not_publishing(ctx.algorithm, mode, pm)
    return None


def _not_publishing(algorithm: str, mode: ForwardMode, pm: WarcorePluginManager) -> str | None:
    phase = resolve_war_publish_phase(algorithm, mode, pm=pm)
    return None if phase.publishes else f"not the publish phase ({phase.source})"


def _answer(backend: Any, mode: ForwardMode) -> tuple[SharedReadBoundary | None, str]:
    """warcore's own answer for the instance, before the bound, and its provenance; ``None``
    where warcore has none (a class warcore-sglang cannot name: no plugin can declare)."""
    pm = _state.pm()
    name, ctx = identify(backend)
    closed = _closed(name, mode, ctx, pm)
    if closed is not None:
        return UNKNOWN, closed
    if name is None:
        return None, "unnamed: no plugin can declare"
    resolution = resolve_shared_read_boundary(name, mode, ctx, pm=pm)
    source = resolution.source
    if len({b for _, b in resolution.answers}) > 1:  # say who answered what
        source += " (" + ", ".join(f"{p}: {b.name}" for p, b in resolution.answers) + ")"
    return resolution.boundary, source


def ours(backend: Any, smode: Any) -> Any:
    """warcore's answer for (instance, sglang mode) as a ``SharedReadEnds``, or ``None``:
    resolved once per plugin set and remembered on the instance."""

    def resolve() -> Any:
        boundary, _ = _answer(backend, oracle.warcore_mode(smode))
        if boundary is None:
            _warn_unnamed(backend)
            return None
        return sglang_ends()[boundary.name]

    return _state.cached(backend, ("ends", smode), resolve)


def _warn_unnamed(backend: Any) -> None:
    _state.log_once(
        ("unnamed", type(backend)),
        logging.WARNING,
        f"warcore-sglang: {type(backend).__qualname__} is not a backend warcore-sglang can "
        "name: its own declaration applies (with warcore's vetoes and force-coarse)",
    )


def decide(backend: Any, smode: Any, own: SharedReadBoundary) -> tuple[SharedReadBoundary, str]:
    """The later of sglang's own answer ``own`` and warcore's for (instance, sglang mode), and
    why: a provenance such as ``plugin:sglang``, ``default:failed:<plugin>``,
    ``forced-coarse``, ``veto:...`` or ``sglang:<Class>.shared_read_ends (...)``."""
    answer, source = _answer(backend, oracle.warcore_mode(smode))
    cls = type(backend).__qualname__
    if answer is None:
        return own, f"sglang:{cls}.shared_read_ends ({source})"
    if own > answer:
        return own, f"sglang:{cls}.shared_read_ends (later than {source}'s {answer.name})"
    return answer, source


def explain(backend: Any, smode: Any) -> tuple[SharedReadBoundary, str]:
    """What the patched ``shared_read_ends`` answers for (instance, sglang mode), and why."""
    with oracle.in_tree():
        own = oracle.boundary_of(type(backend).shared_read_ends(backend, smode))
    return decide(backend, smode, own)


def explain_prefill(backend: Any) -> tuple[SharedReadBoundary, str]:
    """The static prefill decision of the patched prefill point for the instance (sglang's
    switches, warcore's gate, the declaration) and its provenance. A backend's per-batch
    answer can only move it later."""
    release = oracle.release()
    resolver = release is not None and release.prefill == "resolver"  # the publisher ignores it
    if resolver and envs().SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return UNKNOWN, "sglang:SGLANG_FORCE_COARSE_WAR_BARRIER"
    for switch in (read_prefill_switch(DEFAULT, os.environ, envs()), prefill_opt_out()):
        if not switch.on:
            return UNKNOWN, switch.source
    closed, _, _ = prefill_decision(backend)
    if closed is not None:
        return UNKNOWN, closed
    return explain(backend, oracle.api().ForwardMode.EXTEND)


def prefill_opt_out() -> PrefillSwitch:
    """What ``WARCORE_SGLANG_PREFILL_SWITCH=main`` adds to sglang's own prefill switch: sglang
    main's opt-out ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER``. Under the default setting
    nothing (sglang reads its own switch); its warning, if any, is logged once."""
    state = _state.current
    setting = state.prefill_switch if state is not None else DEFAULT
    if setting == DEFAULT:
        return _OWN_SWITCH
    switch = read_prefill_switch(setting, os.environ, envs())
    if switch.warning is not None:
        _state.log_once(("prefill-switch", switch.warning), logging.WARNING, switch.warning)
    return switch


_OWN_SWITCH = PrefillSwitch(True, "sglang's own prefill switch")


def _others(resolution: BoundaryResolution, mine: frozenset[str]) -> SharedReadBoundary:
    """The latest answer of plugins other than warcore-sglang in a resolution tree
    (``UNKNOWN`` if any of them failed or is stale); ``PRE_REPLAY`` when there is none."""
    found = [SharedReadBoundary.PRE_REPLAY]
    stack = [resolution]
    while stack:
        r = stack.pop()
        if r.failures or r.source.startswith(("stale:", "forced-coarse")):
            return UNKNOWN
        found += [b for plugin, b in r.answers if plugin not in mine]
        stack.extend(r.children)
    return latest(found)


def _prefill_decision(backend: Any) -> tuple[str | None, Any, Any]:
    pm = _state.pm()
    name, ctx = identify(backend)
    closed = _closed(name, ForwardMode.EXTEND, ctx, pm) or _not_publishing(
        ctx.algorithm, ForwardMode.EXTEND, pm
    )
    static = sglang_ends().UNKNOWN
    others = SharedReadBoundary.PRE_REPLAY
    if name is not None:
        resolution = resolve_shared_read_boundary(name, ForwardMode.EXTEND, ctx, pm=pm)
        static = sglang_ends()[resolution.boundary.name]
        state = _state.current
        mine = state.plugin_names if state is not None else frozenset()
        others = _others(resolution, mine)
    return closed, static, sglang_ends()[others.name]


def prefill_decision(backend: Any) -> tuple[str | None, Any, Any]:
    """(why the prefill may not publish, ``None`` when it may; warcore's static answer; the
    latest answer of the plugins other than warcore-sglang's own), the last two as
    ``SharedReadEnds``; once per plugin set, remembered on the backend."""
    return _state.cached(backend, ("prefill",), lambda: _prefill_decision(backend))
