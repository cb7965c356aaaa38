"""vLLM's general plugin entry point (group ``vllm.general_plugins``, name ``warcore``).

vLLM's ``load_general_plugins()`` calls :func:`vllm_plugin` once in every vLLM process (the
front end, the engine core, each worker). With ``WARCORE_VLLM=1`` it activates warcore
(:func:`warcore_vllm.activation.install`: it imports nothing of vLLM). Every process says one
start-up line, naming the vLLM release in force: warcore NOT active (and why: not asked, or a
vLLM that is not an audited release, refused), warcore active (every watched module was
imported already, and is checked and patched), or warcore *armed*: the watched modules not
imported yet are checked and patched when this process imports them, which only a process
that builds a model runner does. That process then says one more line: warcore active, with
what it changed, once every watched module is checked and patched and, where the V2 runner's
module is patched, its first V2 runner is built (the line names that runner's ring depth); or
taken off (its code differs from the audited one; vLLM's own guards apply).

This module imports nothing but the standard library at import time (never ``warcore``,
``torch`` or vLLM): a broken ``warcore`` is named in the start-up line, and a process not asked
to activate pays nothing. The switch is read with warcore's own spelling
(:func:`warcore.integration.settings.switch`) once warcore is known to be importable. Never
raises: a failing plugin must not take vLLM down.
"""

from __future__ import annotations

import logging
import os
import sys
import time

__all__ = ["ENV_ACTIVATE", "startup_line", "vllm_plugin"]

ENV_ACTIVATE = "WARCORE_VLLM"

logger = logging.getLogger("warcore.vllm")


def _who() -> str:
    return f"warcore-vllm: process {os.getpid()}"


def _active_line(took: float) -> str:
    from . import activation

    entry = activation.release()
    version = entry.version if entry is not None else "?"
    checked = ", ".join(activation.checked()) + " checked against the audited code"
    if activation.skipped():
        checked += f", {', '.join(activation.skipped())} not imported (a V2 runner is built)"
    changed = "; ".join(activation.changes()) or "nothing to patch in this release"
    return (
        f"{_who()}: warcore active on vLLM {version} ({checked}; warcore's own work "
        f"{took:.3f} s): {changed}"
    )


def _armed_line(took: float) -> str:
    from . import activation

    entry = activation.release()
    version = entry.version if entry is not None else "?"
    pending = ", ".join(sorted(activation.activation.pending))
    return (
        f"{_who()}: warcore armed on vLLM {version} in {took:.3f} s: {pending} checked and "
        "patched when this process imports them (a process that builds no model runner never "
        "does); until then, vLLM as shipped"
    )


def _settled(installed_in: float, version: str, reason: str | None) -> None:
    """The activation settled after start-up (vLLM imported the watched modules): say so."""
    if reason is not None:
        _emit(logging.ERROR, f"{_who()}: warcore taken off on vLLM {version}: {reason}")
        return
    from . import activation

    def say() -> None:
        _emit(logging.INFO, _active_line(installed_in + activation.settled_seconds()))

    if activation.awaits_runner():  # the ring's depth is decided as the runner is built
        activation.when_runner_built(say)
    else:
        say()


def _switch() -> tuple[bool, str | None]:
    """``WARCORE_VLLM`` read: unset or blank is off without importing anything; any other
    value in warcore's own spelling."""
    if not os.environ.get(ENV_ACTIVATE, "").strip():
        return False, None
    from warcore.integration.settings import switch

    return switch(os.environ, ENV_ACTIVATE)


def startup_line() -> tuple[int, str]:
    """Activate if asked; (log level, the start-up line)."""
    on, problem = _switch()
    if not on:
        flag = os.environ.get(ENV_ACTIVATE, "").strip().lower()
        level = logging.INFO if problem is None else logging.WARNING
        why = problem or f"{ENV_ACTIVATE}={flag!r}"
        return level, f"{_who()}: warcore NOT active: {why} (set it to 1)"
    start = time.perf_counter()
    # (seconds install() took, the release): set once install() returned; a settling after
    # that is a line of its own
    installed: list[tuple[float, str]] = []

    def on_settled(reason: str | None) -> None:
        if installed:
            _settled(*installed[0], reason)

    try:
        from . import activation

        activation.install(on_settled=on_settled)
    except Exception as exc:
        return logging.ERROR, (
            f"{_who()}: warcore NOT active, vLLM's own guards apply: {type(exc).__name__}: {exc}"
        )
    took = time.perf_counter() - start
    entry = activation.release()
    installed.append((took, entry.version if entry is not None else "?"))
    if activation.is_active():  # every watched module was imported already: checked, patched
        return logging.INFO, _active_line(took)
    return logging.INFO, _armed_line(took)


def _emit(level: int, line: str) -> None:
    """The line where logging would show it; otherwise on stderr directly (vLLM configures
    only its own ``vllm`` logger): the line is never lost, even when warcore is broken."""
    try:
        from warcore.integration.settings import emit
    except Exception:  # warcore shadowed or broken: the line is never lost
        print(f"[{logging.getLevelName(level)}] {line}", file=sys.stderr, flush=True)
        return
    emit(logger, level, line)


def vllm_plugin() -> None:
    """The entry point (see the module docstring)."""
    try:
        level, line = startup_line()
    except Exception as exc:  # never take vLLM's start-up down
        level, line = logging.ERROR, f"warcore-vllm: start-up failed: {type(exc).__name__}: {exc}"
    _emit(level, line)
