"""The activation's one process-wide state, and its one cache.

The life cycle (install, settle, take off, restore) is warcore's
(:class:`warcore.integration.Activation`, here :data:`activation`); what warcore-sglang adds
is :class:`State`: the release in force, the plugin manager it consults, the switches read at
install, and the cells the ranks disagree on.

Patched points run on sglang's hot paths, so warcore's answers are remembered on the objects
they are for: on each backend, algorithm and worker, one attribute (:data:`CACHE`) holding
``{key: answer}``, taken off every object whenever the tag moves (:func:`tag`: the core plugin
manager's generation, which moves whenever a plugin or a switch changes, through its change
listener; and this module's ``epoch``, which moves when warcore-sglang itself learns something
that changes an answer: a rank disagreement, a backend class learned at run time); an answer is
kept only if the tag did not move while it was computed. Only warcore's answers are kept there,
never sglang's own: sglang is asked on every call (a declaration of 0.5.21 or 0.5.22 changes
per batch). The decode runner's per-replay dict (:data:`FAST`) is the bounded answer itself,
for its own backend by mode (its declaration is audited as a function of the runner and the
mode), taken off in the same way, with the last mode it filled and that mode's answer
(:data:`MODE`, :data:`ENDS`), which the replay reads first.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from warcore.core import WarcorePluginManager, get_plugin_manager
from warcore.integration import Activation

from ..declarations import oracle
from ..releases import SglangRelease
from ..settings import DEFAULT

logger = logging.getLogger("warcore.sglang")

CACHE = "_warcore_sglang"
"""warcore's answers for an object: ``{key: answer}``."""
FAST = "_warcore_sglang_fast"
"""A decode runner's bounded answers for its own backend: mode -> ends (UNKNOWN left out)."""
TABLE = "_warcore_sglang_table"
"""A decode runner's bounded answers for any backend: backend -> mode -> ends."""
MODE, ENDS = "_warcore_sglang_mode", "_warcore_sglang_ends"
"""A decode runner's last mode remembered in :data:`FAST`, and its answer: the replay path's
first look (an identity test, cheaper than a dict lookup keyed by an IntEnum). Written by the
miss path of the runner's own replay only (sglang replays a runner from one thread), ends
before mode; taken off by deleting them, so a reader that sees the mode and then finds no
answer goes the slow way."""
RUNNER = (MODE, ENDS, FAST, TABLE)
"""Every attribute a decode runner's remembered answers occupy."""

T = TypeVar("T")


def describe_sglang() -> str:
    """``sglang <version> at <folder> (commit <id>)``: which sglang this process runs."""
    import importlib.util
    import os

    version = oracle.installed_version()
    spec = importlib.util.find_spec("sglang")
    where = os.path.dirname(spec.origin) if spec is not None and spec.origin else "(not importable)"
    module = sys.modules.get("sglang._version")
    commit = getattr(module, "__commit_id__", None) if module is not None else None
    return f"sglang {version} at {where} (commit {commit or 'unknown'})"


activation = Activation(
    "warcore-sglang", logger, describe_sglang, "sglang's own barrier decisions apply"
)
"""The life cycle: which release is installed, what is patched, settled or taken off."""


@dataclass
class State:
    release: SglangRelease
    pm: WarcorePluginManager
    plugin_names: frozenset[str] = frozenset()
    """The names warcore-sglang's own plugin is registered under (its answers are sglang's)."""
    prefill_switch: str = DEFAULT
    """``WARCORE_SGLANG_PREFILL_SWITCH`` as read at install."""
    coarse: frozenset[Any] = frozenset()
    """(backend name, mode) cells the ranks disagree on under ``WARCORE_SGLANG_CHECK_RANKS=warn``
    (``"*"``: every cell): coarse in this process."""
    meter: str | None = None
    """``WARCORE_SGLANG_METER``'s file: every patched point timed, one line per batch."""


lock = activation.lock
current: State | None = None
"""The installed activation's state; ``None`` when not installed (every patch passes through).
Other modules read it as an attribute of this module (it is rebound)."""
epoch = 0
CACHED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Objects holding a cache or a decode runner's dicts: a change takes them off again."""


def tag() -> tuple[int, int]:
    state = current
    return (state.pm.generation if state is not None else -1, epoch)


def cached(holder: Any, key: Any, compute: Callable[[], T]) -> T:
    """warcore's answer ``key`` for ``holder``: one attribute read and one dict lookup once
    computed. The dict is taken off every holder whenever the tag moves (:func:`invalidate`),
    and an answer computed while it moved is returned, never kept. Read with
    ``object.__getattribute__``: a worker that hands the attributes it lacks to its target
    worker (``__getattr__``) must not answer with its target's cache; never through
    ``__dict__``, whose reading would make every later attribute read of a hot object
    slower."""
    try:
        return object.__getattribute__(holder, CACHE)[key]  # type: ignore[no-any-return]
    except (AttributeError, KeyError):
        pass
    now = tag()
    value = compute()
    with lock:
        if tag() != now or current is None:
            return value
        try:
            answers = object.__getattribute__(holder, CACHE)
        except AttributeError:
            answers = {}
            try:
                CACHED.add(holder)  # invalidation must find it: no weak reference, no cache
                setattr(holder, CACHE, answers)
            except (AttributeError, TypeError):  # a holder without attributes or weak refs
                return value
        answers[key] = value
    return value


def forget(holder: Any, keys: tuple[str, ...] = (*RUNNER, CACHE)) -> None:
    """Take cached answers off ``holder`` (``delattr``, never through its ``__dict__``)."""
    for key in keys:
        with contextlib.suppress(AttributeError):
            delattr(holder, key)


def invalidate(*, learned: bool = True) -> None:
    """Every remembered answer is stale: taken off every object holding one (``learned``:
    warcore-sglang's own epoch moves too, for what the core's generation does not see)."""
    global epoch
    with lock:
        if learned:
            epoch += 1
        for holder in list(CACHED):
            forget(holder)


def drop_caches() -> None:
    """Take every remembered answer off the objects holding one (taking off, uninstalling)."""
    with lock:
        invalidate()
        CACHED.clear()


def on_change() -> None:
    """The core's plugins or switches changed (its listener): the generation moved already."""
    if current is not None:
        invalidate(learned=False)


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
    module = sys.modules.get("warcore_sglang.declarations.plugin")
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
