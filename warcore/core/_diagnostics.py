"""What the manager says about its plugins: the listing entries (``warcore plugins``) and the
validation of a plugin's hooks (misspelled, unmarked, wrappers)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Literal

import pluggy

from ._hookspecs import WarcoreSpecs

__all__ = [
    "PLUGIN_ERRORS",
    "PluginInfo",
    "PluginValidationError",
    "failure_text",
    "hook_problems",
    "source_path",
]

PLUGIN_ERRORS = (Exception, SystemExit)
"""What a plugin's code may raise and still be only that plugin's failure: a ``sys.exit()`` in
a hook or at import is a bug of the plugin, never the engine's exit. ``KeyboardInterrupt`` is
not among them: it is the operator's, and goes on."""


def failure_text(exc: BaseException) -> str:
    """``Type: message`` of a plugin's exception, never raising (its ``__str__`` may)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return f"{type(exc).__name__} (its message raised)"


PluginStatus = Literal["active", "disabled", "failed"]

KNOWN_HOOKS = frozenset(n for n in vars(WarcoreSpecs) if n.startswith("warcore_"))


class PluginValidationError(ValueError):
    """A plugin implements something warcore does not know (a misspelled hook, say)."""


@dataclass(frozen=True)
class PluginInfo:
    """One discovered plugin, whatever became of it."""

    name: str
    distribution: str | None
    version: str | None
    status: PluginStatus
    hooks: tuple[str, ...] = ()
    error: str | None = None
    path: str | None = None
    value: str | None = None
    registered_by: str = "entry point"
    """``entry point``, ``core`` (the built-ins), ``plugin:<name>`` (registered at run time by
    that plugin's code) or ``runtime`` (registered at run time by anything else)."""
    load_ms: float | None = None
    """Import, registration and validation, in ms (``None``: not loaded from an entry point)."""
    warnings: tuple[str, ...] = ()

    def replace(self, **changes: Any) -> PluginInfo:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "hooks": list(self.hooks),
            "error": self.error,
            "path": self.path,
            "entry_point": self.value,
            "registered_by": self.registered_by,
            "load_ms": None if self.load_ms is None else round(self.load_ms, 3),
            "warnings": list(self.warnings),
        }


def source_path(plugin: object) -> str | None:
    """The file the plugin (a module or class, else its class) was defined in; ``None`` where
    there is none: a built-in, or code typed into ``python -c``, a REPL or a notebook cell
    (``inspect`` raises ``OSError`` for a class of ``__main__`` without a file)."""
    for candidate in (plugin, type(plugin)):
        try:
            return inspect.getfile(candidate)  # type: ignore[arg-type]
        except (TypeError, OSError):
            continue
    return None


def hook_problems(pm: pluggy.PluginManager, name: str, plugin: object) -> list[str]:
    """What is wrong with ``plugin``'s hooks: functions pluggy would silently ignore, else
    the first hook warcore does not know or that is a wrapper (empty: nothing)."""
    unmarked = _unmarked_hooks(pm, name, plugin)
    if unmarked:
        return unmarked
    known = ", ".join(sorted(KNOWN_HOOKS))
    for hookcaller in pm.get_hookcallers(plugin) or ():
        if hookcaller.spec is None:
            hook = hookcaller.name
            return [f"plugin {name!r} implements unknown hook {hook!r}; known hooks: {known}"]
        for impl in hookcaller.get_hookimpls():
            if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                return [
                    f"plugin {name!r}: hook {hookcaller.name!r} is a wrapper; warcore asks "
                    "each plugin on its own, so implement it as a plain hookimpl"
                ]
    return []


def _unmarked_hooks(pm: pluggy.PluginManager, name: str, plugin: object) -> list[str]:
    """``warcore_*`` functions of ``plugin`` that pluggy would silently ignore: not marked
    ``@warcore.hookimpl`` (whether or not the name is a hook)."""
    problems = []
    known = ", ".join(sorted(KNOWN_HOOKS))
    for attr in sorted(dir(plugin)):
        if not attr.startswith("warcore_"):
            continue
        try:
            value = getattr(plugin, attr)
        except Exception:  # a property that raises: not a function anyway
            continue
        if not inspect.isroutine(value) or pm.parse_hookimpl_opts(plugin, attr) is not None:
            continue
        if attr in KNOWN_HOOKS:
            problems.append(
                f"plugin {name!r}: function {attr!r} is not marked @warcore.hookimpl, so "
                "warcore would never call it"
            )
        else:
            close = difflib.get_close_matches(attr, sorted(KNOWN_HOOKS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f"plugin {name!r}: function {attr!r} is not a warcore hook{hint} and is not "
                f"marked @warcore.hookimpl; known hooks: {known}"
            )
    return problems
