"""Generic patching: set an attribute so that it can be put back exactly.

Uninstalling must leave sglang as it was: the very objects sglang defined back in place, and an
attribute a class only inherited deleted again (not pinned to the inherited value). So every
patch is recorded (:func:`set_attr`) with what the owner's own ``__dict__`` held, and each
replacement remembers what it replaced (``__warcore_original__``, which
:func:`warcore_sglang._sglang.unwrap` follows to ask sglang's own code). A class hierarchy is
patched where each class defines the attribute, now and for subclasses defined later
(:func:`patch_tree`, through the base's ``__init_subclass__``): sglang's plugins define their
backends after the activation is installed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import _state
from ._state import MISSING, Patch

logger = logging.getLogger("warcore.sglang")


def set_attr(owner: Any, attr: str, value: Any) -> None:
    """``setattr``, recorded on the installed state so :func:`restore` can undo it."""
    state = _state.current
    assert state is not None
    state.patches.append(Patch(owner, attr, vars(owner).get(attr, MISSING)))
    setattr(owner, attr, value)


def restore(patches: list[Patch]) -> None:
    """Undo ``patches``, last first: the original objects back, inherited attributes deleted."""
    for patch in reversed(patches):
        if patch.original is MISSING:
            with contextlib.suppress(AttributeError):
                delattr(patch.owner, patch.attr)
        else:
            setattr(patch.owner, patch.attr, patch.original)
    patches.clear()


def wrap(function: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` dressed as ``original``, remembering it."""
    functools.update_wrapper(function, original)
    function.__warcore_original__ = original  # type: ignore[attr-defined]
    return function


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        if klass not in out:
            out.append(klass)
            stack.extend(klass.__subclasses__())
    return out


def on_subclasses(base: type, key: str, callback: Callable[[type], None]) -> None:
    """Run ``callback(cls)`` for ``base``, each subclass defined now, and each one defined
    later (``base.__init_subclass__``, chained with what was there; ``key`` names the hook so
    that it is installed once). A failure in a class defined later never fails sglang's class
    statement: the activation is told and takes itself off."""
    for cls in (base, *_subclasses(base)):
        callback(cls)
    previous = vars(base).get("__init_subclass__", MISSING)
    if key in getattr(getattr(previous, "__func__", None), "__warcore_keys__", ()):
        return

    def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
        if previous is MISSING:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        else:
            previous.__func__(cls, **kwargs)
        if _state.current is not None:
            with _state.lock:
                _guarded(f"{cls.__module__}.{cls.__qualname__}", callback, cls)

    keys = getattr(getattr(previous, "__func__", None), "__warcore_keys__", ())
    __init_subclass__.__warcore_keys__ = (*keys, key)  # type: ignore[attr-defined]
    set_attr(base, "__init_subclass__", classmethod(__init_subclass__))


def patch_tree(
    base: type,
    attr: str,
    make: Callable[[Any], Any],
    gate: Callable[[type], None] | None = None,
) -> None:
    """Patch ``attr`` where ``base`` and each subclass defines it, now and for classes defined
    later; ``gate(cls)`` checks each such class first (raising
    :class:`~._shape.ShapeMismatch`)."""

    def patch(cls: type) -> None:
        if _state.current is None or attr not in vars(cls):
            return
        if hasattr(vars(cls)[attr], "__warcore_original__"):
            return
        if gate is not None:
            gate(cls)
        set_attr(cls, attr, make(vars(cls)[attr]))

    on_subclasses(base, attr, patch)


def _guarded(what: str, function: Callable[..., None], *args: Any) -> None:
    """Run a check-and-patch step; a failure goes to the activation (never to sglang)."""
    try:
        function(*args)
    except Exception as exc:
        state = _state.current
        if state is not None and state.on_failure is not None:
            state.on_failure(what, exc)
        else:
            logger.exception("warcore-sglang: patching %s failed", what)


def apply(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Run a module's check-and-patch callback from the post-import hook: never raises (a
    module that fails its check or its patch takes the whole activation off)."""
    with _state.lock:
        if _state.current is not None:
            _guarded(module.__name__, callback, module)
