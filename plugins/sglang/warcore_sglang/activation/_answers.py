"""warcore's answer for a live backend, bounded by sglang's own, with its provenance.

The patched declaration points (:mod:`._points`) return these decisions; the trace and the
sanitizer report them with :func:`explain` / :func:`explain_prefill`, so what a report says is
what the patched method did. Two rules hold for every decision: it is never earlier than
sglang's own answer for the same call (:func:`decide` takes the later), and warcore's vetoes,
force-coarse and publish phase close it (UNKNOWN: a coarse barrier).
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

from .. import _sglang
from .._names import SRT
from .._prefill_switch import DEFAULT, PrefillSwitch, read_prefill_switch
from . import _state
from ._identity import identify

UNKNOWN = SharedReadBoundary.UNKNOWN


def base_module() -> Any:
    """sglang's ``base_attn_backend`` (complete whenever a patched module has been imported:
    every one of them imports it; the constants come from it, not from a fresh import, so that
    patching inside an import chain never re-enters a half-imported module)."""
    return sys.modules[SRT + "layers.attention.base_attn_backend"]


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
    # EXTEND's gate is the algorithm's supports_prefill_shared_read_done (patched too); no
    # other sglang runner gates on the algorithm, so a phase that does not publish is UNKNOWN.
    if mode is not ForwardMode.EXTEND:
        phase = resolve_war_publish_phase(ctx.algorithm, mode, pm=pm)
        if not phase.publishes:
            return f"not the publish phase ({phase.source})"
    return None


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


def decide(backend: Any, smode: Any, own: SharedReadBoundary) -> tuple[SharedReadBoundary, str]:
    """The later of sglang's own answer ``own`` and warcore's for (instance, sglang mode), and
    why: a provenance such as ``plugin:sglang``, ``default:failed:<plugin>``,
    ``forced-coarse``, ``veto:...`` or ``sglang:<Class>.shared_read_ends (...)``."""
    ours, source = _answer(backend, _sglang.warcore_mode(smode))
    cls = type(backend).__qualname__
    if ours is None:
        _state.log_once(
            ("unnamed", type(backend)),
            logging.WARNING,
            f"warcore-sglang: {cls} is not a backend warcore-sglang can name: its own "
            "declaration applies (with warcore's vetoes and force-coarse)",
        )
        return own, f"sglang:{cls}.shared_read_ends ({source})"
    if own > ours:
        _state.log_once(
            ("later", type(backend), smode),
            logging.WARNING,
            f"warcore-sglang: {cls} itself declares {own.name} for {smode.name}, later than "
            f"warcore's {ours.name} ({source}): using {own.name}",
        )
        return own, f"sglang:{cls}.shared_read_ends (later than {source}'s {ours.name})"
    return ours, source


def decide_ends(backend: Any, smode: Any, own_ends: Any) -> Any:
    """:func:`decide` in sglang's terms: a ``SharedReadEnds`` for sglang's own ``own_ends``."""
    return _sglang.ends_of(decide(backend, smode, _sglang.boundary_of(own_ends))[0])


def explain(backend: Any, smode: Any) -> tuple[SharedReadBoundary, str]:
    """What the patched ``shared_read_ends`` answers for (instance, sglang mode), and why."""
    with _sglang.in_tree():
        own = _sglang.boundary_of(type(backend).shared_read_ends(backend, smode))
    return decide(backend, smode, own)


def explain_prefill(backend: Any) -> tuple[SharedReadBoundary, str]:
    """The static prefill decision of the patched ``resolve_prefill_shared_read_ends`` for the
    instance (sglang's switches, warcore's gate, the declaration) and its provenance. A
    backend's per-batch snapshot can only move it later."""
    envs = base_module().envs
    if envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return UNKNOWN, "sglang:SGLANG_FORCE_COARSE_WAR_BARRIER"
    for switch in (read_prefill_switch(DEFAULT, os.environ, envs), prefill_opt_out()):
        if not switch.on:
            return UNKNOWN, switch.source
    closed, _, _ = prefill_decision(backend)
    if closed is not None:
        return UNKNOWN, closed
    return explain(backend, _sglang.api().ForwardMode.EXTEND)


def prefill_opt_out() -> PrefillSwitch:
    """What ``WARCORE_SGLANG_PREFILL_SWITCH=main`` adds to sglang's own prefill switch: sglang
    main's opt-out ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER``. Under the default setting
    nothing (sglang's resolver reads its own switch); its warning, if any, is logged once."""
    state = _state.current
    setting = state.prefill_switch if state is not None else DEFAULT
    if setting == DEFAULT:
        return PrefillSwitch(True, "sglang's own prefill switch")
    switch = read_prefill_switch(setting, os.environ, getattr(base_module(), "envs", None))
    if switch.warning is not None:
        _state.log_once(("prefill-switch", switch.warning), logging.WARNING, switch.warning)
    return switch


def _others(resolution: BoundaryResolution, ours: frozenset[str]) -> SharedReadBoundary:
    """The latest answer of plugins other than warcore-sglang in a resolution tree
    (``UNKNOWN`` if any of them failed or is stale); ``PRE_REPLAY`` when there is none."""
    found = [SharedReadBoundary.PRE_REPLAY]
    stack = [resolution]
    while stack:
        r = stack.pop()
        if r.failures or r.source.startswith(("stale:", "forced-coarse")):
            return UNKNOWN
        found += [b for plugin, b in r.answers if plugin not in ours]
        stack.extend(r.children)
    return latest(found)


def prefill_decision(backend: Any) -> tuple[str | None, Any, Any]:
    """(why the prefill may not publish, None when it may; the static answer; the latest other
    plugin's answer), the last two as ``SharedReadEnds``."""
    pm = _state.pm()
    name, ctx = identify(backend)
    closed = _closed(name, ForwardMode.EXTEND, ctx, pm)
    if closed is None:
        phase = resolve_war_publish_phase(ctx.algorithm, ForwardMode.EXTEND, pm=pm)
        if not phase.publishes:
            closed = f"not the publish phase ({phase.source})"
    static = backend.shared_read_ends(_sglang.api().ForwardMode.EXTEND)
    others = SharedReadBoundary.PRE_REPLAY
    if name is not None:
        state = _state.current
        ours = state.plugin_names if state is not None else frozenset()
        others = _others(resolve_shared_read_boundary(name, ForwardMode.EXTEND, ctx, pm=pm), ours)
    return closed, static, _sglang.ends_of(others)
