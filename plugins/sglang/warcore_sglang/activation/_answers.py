"""What warcore answers for a live backend, with its provenance.

The patched declaration points (:mod:`._points`) return these answers; the trace and the
sanitizer report them with :func:`explain` / :func:`explain_prefill`, so what a report says is
what the patched method did. Two rules hold for every answer: it is never earlier than sglang's
own answer for the instance (a plugin cannot move a fence earlier than the code it fences), and
warcore's vetoes, force-coarse and publish phase close it (UNKNOWN: a coarse barrier).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from warcore import BoundaryContext, ForwardMode, SharedReadBoundary, latest
from warcore.core import (
    BoundaryResolution,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)

from .. import _sglang
from .._names import SRT
from .._prefill_switch import DEFAULT, PrefillSwitch, read_prefill_switch
from . import _state
from ._identity import identify


def _sglang_own(backend: Any, smode: Any) -> SharedReadBoundary:
    with _sglang.in_tree():
        return _sglang.boundary_of(type(backend).shared_read_ends(backend, smode))


def _declared(backend: Any, mode: ForwardMode) -> tuple[SharedReadBoundary, BoundaryContext, str]:
    """warcore's boundary for the instance, never earlier than sglang's own answer for it, and
    its provenance."""
    pm = _state.pm()
    name, ctx = identify(backend)
    smode = _sglang.sglang_mode(mode)
    own = _sglang_own(backend, smode)
    cls = type(backend).__qualname__
    if name is None:
        _state.log_once(
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
        _state.log_once(
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


def explain(backend: Any, smode: Any) -> tuple[SharedReadBoundary, str]:
    """What the patched ``shared_read_ends`` answers for (instance, sglang mode), and why: a
    provenance such as ``plugin:sglang``, ``default:failed:<plugin>``, ``forced-coarse``,
    ``veto:...`` or ``sglang:<Class>.shared_read_ends (...)``."""
    mode = _sglang.warcore_mode(smode)
    boundary, ctx, source = _declared(backend, mode)
    pm = _state.pm()
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
    envs = base_module().envs
    if envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return SharedReadBoundary.UNKNOWN, "sglang:SGLANG_FORCE_COARSE_WAR_BARRIER"
    switch = prefill_switch(envs)
    if not switch.on:
        return SharedReadBoundary.UNKNOWN, switch.source
    closed, _, _ = prefill_decision(backend)
    if closed is not None:
        return SharedReadBoundary.UNKNOWN, closed
    return explain(backend, _sglang.api().ForwardMode.EXTEND)


def prefill_switch(envs: Any) -> PrefillSwitch:
    """sglang's prefill switch, read as ``WARCORE_SGLANG_PREFILL_SWITCH`` (read at install)
    says; its warning, if any, is logged once."""
    state = _state.current
    setting = state.prefill_switch if state is not None else DEFAULT
    switch = read_prefill_switch(setting, os.environ, envs)
    if switch.warning is not None:
        _state.log_once(("prefill-switch", switch.warning), logging.WARNING, switch.warning)
    return switch


def effective(backend: Any, smode: Any) -> Any:
    """What the patched ``shared_read_ends`` returns for (instance, sglang mode)."""
    return _sglang.ends_of(explain(backend, smode)[0])


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


def prefill_decision(backend: Any) -> tuple[str | None, Any, Any]:
    """(why the prefill may not publish, None when it may; the static answer; the latest other
    plugin's answer)."""
    api = _sglang.api()
    pm = _state.pm()
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
        state = _state.current
        ours = state.plugin_names if state is not None else frozenset()
        others = _others(resolve_shared_read_boundary(name, extend, ctx, pm=pm), ours)
    return closed, static, _sglang.ends_of(others)


def base_module() -> Any:
    """sglang's ``base_attn_backend`` (complete whenever a patched module has been imported:
    every one of them imports it; the constants come from it, not from a fresh import, so that
    patching inside an import chain never re-enters a half-imported module)."""
    return sys.modules[SRT + "layers.attention.base_attn_backend"]
