"""Patching an engine so that it can be put back exactly.

Taking an integration off must leave the engine as it was: the very objects the engine defined
back in place, and an attribute a class only inherited deleted again (not pinned to the
inherited value). So a :class:`Patcher` records every attribute it sets with what the owner's
own ``__dict__`` held, and each replacement remembers what it replaced
(``__warcore_original__``: :func:`unwrap` follows it to reach the engine's own code, and the
engine-code checks read through it). A class hierarchy is patched where each class defines the
attribute, now and for subclasses defined later (:meth:`Patcher.patch_tree`, through the base's
``__init_subclass__``): an engine's plugins define their classes after the integration is
installed.

Standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MISSING", "Patch", "Patcher", "subclasses", "unwrap", "wrap"]

MISSING: Any = object()
"""A patched attribute's original when the owner only inherited it (restored by deleting it)."""


@dataclass
class Patch:
    owner: Any
    attr: str
    original: Any
    """``vars(owner)[attr]`` when it was patched, or :data:`MISSING`."""


def wrap(function: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` dressed as ``original`` (name, docstring), remembering it."""
    functools.update_wrapper(function, original)
    function.__warcore_original__ = original  # type: ignore[attr-defined]
    return function


def unwrap(value: Any) -> Any:
    """The attribute the engine defined, under any integration's patches of it."""
    while hasattr(value, "__warcore_original__"):
        value = value.__warcore_original__
    return value


def subclasses(cls: type) -> list[type]:
    """Every class deriving from ``cls``, now (depth first, each once)."""
    out: list[type] = []
    stack: list[type] = list(cls.__subclasses__())
    while stack:
        klass = stack.pop()
        if klass not in out:
            out.append(klass)
            stack.extend(klass.__subclasses__())
    return out


class Patcher:
    """The attributes one activation set, to be put back exactly, last first.

    ``on_failure(what, exc)`` is told when a check or a patch run for a class defined later
    fails (its class statement must never fail for it); ``lock`` is held while patching and
    restoring, and by those callbacks (an activation passes its own: one lock, no order to keep).
    """

    def __init__(
        self,
        on_failure: Callable[[str, Exception], None],
        lock: threading.RLock | None = None,
    ) -> None:
        self.lock = lock if lock is not None else threading.RLock()
        self.patches: list[Patch] = []
        self.on = True
        """False once restored: a hook left on a class defined later does nothing."""
        self._on_failure = on_failure

    def set(self, owner: Any, attr: str, value: Any, original: Any = MISSING) -> None:
        """``setattr``, recorded so that :meth:`restore` can undo it: put back what the owner
        held, or ``original`` where the engine bound a patched object itself (``from module
        import name`` after the module was patched) and its own object belongs there."""
        with self.lock:
            held = vars(owner).get(attr, MISSING) if original is MISSING else original
            self.patches.append(Patch(owner, attr, held))
            setattr(owner, attr, value)

    def restore(self) -> None:
        """Undo every patch, last first: the originals back, inherited attributes deleted."""
        with self.lock:
            self.on = False
            for patch in reversed(self.patches):
                if patch.original is MISSING:
                    with contextlib.suppress(AttributeError):
                        delattr(patch.owner, patch.attr)
                else:
                    setattr(patch.owner, patch.attr, patch.original)
            self.patches.clear()

    def guarded(self, what: str, function: Callable[..., None], *args: Any) -> None:
        """Run a check-and-patch step where the engine's own code runs (its import, a class
        statement): a failure goes to ``on_failure``, never to the engine."""
        with self.lock:
            if not self.on:
                return
            try:
                function(*args)
            except Exception as exc:
                self._on_failure(what, exc)

    def on_subclasses(self, base: type, key: str, callback: Callable[[type], None]) -> None:
        """Run ``callback(cls)`` for ``base``, each subclass defined now, and each one defined
        later (``base.__init_subclass__``, chained with what was there; ``key`` names the hook
        so that it is installed once per activation)."""
        for cls in (base, *subclasses(base)):
            callback(cls)
        previous = vars(base).get("__init_subclass__", MISSING)
        keys = getattr(getattr(previous, "__func__", None), "__warcore_keys__", ())
        if key in keys:
            return

        def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
            if previous is MISSING:
                super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
            else:
                previous.__func__(cls, **kwargs)
            self.guarded(f"{cls.__module__}.{cls.__qualname__}", callback, cls)

        __init_subclass__.__warcore_keys__ = (*keys, key)  # type: ignore[attr-defined]
        self.set(base, "__init_subclass__", classmethod(__init_subclass__))

    def patch_tree(
        self,
        base: type,
        attr: str,
        make: Callable[[Any], Any],
        gate: Callable[[type], None] | None = None,
    ) -> None:
        """Patch ``attr`` with ``make(original)`` where ``base`` and each subclass defines it,
        now and for classes defined later; ``gate(cls)`` checks each such class first (it
        raises to refuse it)."""

        def patch(cls: type) -> None:
            if attr not in vars(cls) or hasattr(vars(cls)[attr], "__warcore_original__"):
                return
            if gate is not None:
                gate(cls)
            self.set(cls, attr, make(vars(cls)[attr]))

        self.on_subclasses(base, attr, patch)
