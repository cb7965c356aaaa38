"""The activation's one process-wide state, and the generation every cached answer carries.

Patched declaration points run on sglang's hot paths (the decode runner asks on every
``execute``), so they cache their answers: per instance, and in two process-wide dicts. A cache
entry is only good for the generation it was computed in; :func:`invalidate` bumps the
generation whenever warcore's plugins or switches change (the manager's change listener), so
no answer outlives the configuration it was resolved under. Other modules read ``current`` and
``gen`` as attributes of this module (never ``from ... import``: they are rebound).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warcore.core import WarcorePluginManager, get_plugin_manager

from .._post_import import PostImportFinder
from .._prefill_switch import DEFAULT

MISSING = object()
"""A patched attribute's original when the owner inherited it (restored by deleting it)."""
SRE = "_warcore_sglang_sre"
"""A backend's cached ``shared_read_ends`` answers."""
PREFILL = "_warcore_sglang_prefill"
"""A backend's cached prefill decision."""
TABLE = "_warcore_sglang_table"
"""A decode runner's answers: backend -> mode -> ends."""
FAST = "_warcore_sglang_fast"
"""A decode runner's answers for its own backend: mode -> ends (UNKNOWN left out)."""
OWNER = "_warcore_sglang_owner"
"""A worker's event owners: (generation, (has draft, staged) -> owner name)."""
PER_INSTANCE = (SRE, PREFILL, TABLE, FAST, OWNER)


@dataclass
class Patch:
    owner: Any
    attr: str
    original: Any  # vars(owner)[attr], or MISSING when the attribute was inherited


@dataclass
class State:
    pm: WarcorePluginManager
    patches: list[Patch] = field(default_factory=list)
    finder: PostImportFinder | None = None
    plugin_names: frozenset[str] = frozenset()
    prefill_switch: str = DEFAULT
    """``WARCORE_SGLANG_PREFILL_SWITCH`` as read at install (:mod:`.._prefill_switch`)."""
    version: str = ""
    """The audited sglang version installed (the key of ``_names.AUDITED`` the gate checks)."""
    pending: set[str] = field(default_factory=set)
    """The watched modules not checked and patched yet."""
    settled: bool = False
    """Every watched module is checked and patched (said once)."""
    on_settled: Callable[[str | None], None] | None = None
    """Told once: ``None`` when every watched module is patched, else why warcore is off."""
    seconds: float = 0.0
    """warcore-sglang's time in this process after :func:`install` returned: checking and
    patching the watched modules as sglang imports them, and the checkpoint."""
    coarse: frozenset[Any] = frozenset()
    """(backend name, mode) cells the ranks disagree on under ``WARCORE_SGLANG_CHECK_RANKS=warn``
    (``"*"``: every cell): coarse in this process."""
    meter: str | None = None
    """``WARCORE_SGLANG_METER``'s file: every patched point timed, one line per batch."""
    on_failure: Callable[[str, Exception], None] | None = None
    """What a failed check or patch calls (the activation then takes itself off)."""


lock = threading.RLock()
current: State | None = None
"""The installed activation; ``None`` when not installed (every patch passes through)."""
degraded_check: str | None = None
"""The check that failed where the activation took itself off in this process, or ``None``
(the same on every rank where it fails, unlike the start-up line, which names where sglang is
installed)."""
gen = 0
"""Bumped when warcore's plugins or switches change: every cached answer of an older
generation is recomputed on next use."""
PUBLISH: dict[Any, bool] = {}
"""sglang algorithm -> warcore's publish phase for EXTEND."""
CACHED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Backends and decode runners holding a per-instance cache: a change or uninstalling takes it
off them again."""


def forget(holder: Any, keys: tuple[str, ...]) -> None:
    """Take cached answers off ``holder`` (``delattr``: never through its ``__dict__``, which
    would slow every later attribute read of a runner)."""
    for key in keys:
        with contextlib.suppress(AttributeError):
            delattr(holder, key)


def invalidate() -> None:
    """Forget every cached answer: the decode runners' tables at once (their fast path checks
    nothing else), the per-backend ones by generation."""
    global gen
    with lock:
        gen += 1
        PUBLISH.clear()
        for holder in list(CACHED):
            forget(holder, (FAST, TABLE))


def drop_caches() -> None:
    """Take every per-instance cache off the objects holding one."""
    with lock:
        invalidate()
        for holder in list(CACHED):
            forget(holder, PER_INSTANCE)
        CACHED.clear()


def on_change() -> None:
    if current is not None:
        invalidate()


def pm() -> WarcorePluginManager:
    """The process-wide manager; a reset one is followed (listener moved, caches dropped)."""
    manager = get_plugin_manager()
    state = current
    if state is not None and state.pm is not manager:
        with lock:
            if state.pm is not manager:
                with contextlib.suppress(ValueError, AttributeError):
                    state.pm.remove_change_listener(on_change)
                state.pm = manager
                state.plugin_names = sglang_plugin_names(manager)
                manager.add_change_listener(on_change)
                invalidate()
    return manager


def sglang_plugin_names(manager: WarcorePluginManager) -> frozenset[str]:
    """The names warcore-sglang's own plugin is registered under (its answers are sglang's)."""
    module = sys.modules.get("warcore_sglang.plugin")
    return frozenset(name for name, plugin in manager.list_name_plugin() if plugin is module)


def log_once(key: object, level: int, message: str) -> None:
    get_plugin_manager().log_once(("warcore-sglang", key), level, message)


def log_failure(key: tuple[object, ...], what: str, exc: Exception, fallback: str) -> None:
    """Once per (key, error): ``what`` failed inside a patched point, and what it answered
    instead (never less safe than sglang's own answer)."""
    try:  # inside sglang's call: an exception whose str raises must not escape from here
        error = f"{type(exc).__name__}: {exc}"
    except Exception:
        error = f"{type(exc).__name__} (its message raised)"
    log_once((*key, error), logging.ERROR, f"warcore-sglang: {what} failed ({error}); {fallback}")
