"""Backends and algorithms offered by plugins, indexed by name."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from ._diagnostics import PLUGIN_ERRORS, failure_text
from ._flags import check_flags
from ._manager import WarcorePluginManager
from ._select import BUILTIN_PLUGIN_NAME
from ._specs import CORE_FLAGS, AlgorithmSpec, BackendSpec, FlagSpec, FlagValue

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError", "get_registry"]

logger = logging.getLogger("warcore.plugins")

S = TypeVar("S", BackendSpec, AlgorithmSpec, FlagSpec)


class UnknownNameError(KeyError):
    """An unknown backend or algorithm name; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNameError(ValueError):
    """Two plugins offer the same backend or algorithm name."""


@dataclass(frozen=True)
class Offer(Generic[S]):
    spec: S
    plugin: str


class Registry:
    """The backends and algorithms of one plugin-manager generation.

    A name offered twice is kept out of the registry and reported in ``problems``; looking it
    up raises :class:`DuplicateNameError` naming both plugins. Other names are unaffected.
    """

    def __init__(self, pm: WarcorePluginManager) -> None:
        self.generation = pm.generation
        self.problems: list[str] = []
        self._duplicates: dict[str, str] = {}
        self.backends: dict[str, Offer[BackendSpec]] = self._collect(
            pm, "warcore_attention_backends", BackendSpec, "backend"
        )
        self.algorithms: dict[str, Offer[AlgorithmSpec]] = self._collect(
            pm, "warcore_speculative_algorithms", AlgorithmSpec, "algorithm"
        )
        self._flag_conflicts: dict[str, str] = {}
        self.flags: dict[str, Offer[FlagSpec]] = self._collect_flags(pm)
        """Engine flags: the core's (:data:`CORE_FLAGS`) and those plugins declare through
        ``warcore_engine_flags``. Several plugins may declare one flag (they read the same
        switch) if they agree on its kind and default; otherwise it is disabled and reported."""

    def _collect(
        self, pm: WarcorePluginManager, hook: str, kind: type[S], label: str
    ) -> dict[str, Offer[S]]:
        offered = self._offers(pm, hook, kind)
        offers: dict[str, Offer[S]] = {}
        for name, candidates in sorted(offered.items()):
            if len(candidates) == 1:
                offers[name] = candidates[0]
                continue
            core = [c for c in candidates if c.plugin == BUILTIN_PLUGIN_NAME]
            if core:
                # A name the core registers stays the core's: a plugin cannot replace (or, by
                # offering it too, disable) a built-in.
                offers[name] = core[0]
                for c in candidates:
                    if c.plugin == BUILTIN_PLUGIN_NAME:
                        continue
                    message = (
                        f"plugin {_describe(pm, c.plugin)!r} offers {label} {name!r}, a name the "
                        f"core registers; its offer is ignored (the core's {label} stays)"
                    )
                    self.problems.append(message)
                    pm.log_once(("core-name", c.plugin, label, name), logging.ERROR, message)
                continue
            who = " and ".join(sorted(repr(_describe(pm, c.plugin)) for c in candidates))
            message = f"{label} {name!r} is offered by more than one plugin: {who}; it is disabled"
            self._duplicates[f"{label}:{name}"] = message
            self.problems.append(message)
            pm.log_once(("duplicate", label, name, who), logging.ERROR, message)
        return offers

    def _offers(
        self, pm: WarcorePluginManager, hook: str, kind: type[S]
    ) -> dict[str, list[Offer[S]]]:
        """Every plugin's specs from ``hook``, by name; a plugin whose hook fails or returns
        something else is a problem and offers nothing."""
        offered: dict[str, list[Offer[S]]] = {}
        for impl in getattr(pm.hook, hook).get_hookimpls():
            try:
                result = pm.call_hookimpl(hook, impl, {})
                specs = [] if result is None else list(result)
                for spec in specs:
                    if not isinstance(spec, kind):
                        raise TypeError(f"returned {spec!r}, expected {kind.__name__}")
            except PLUGIN_ERRORS as exc:
                problem = f"plugin {impl.plugin_name!r} hook {hook!r} failed: {failure_text(exc)}"
                self.problems.append(problem)
                _log_failure(pm, impl.plugin_name, hook, exc, problem)
                continue
            for spec in specs:
                offered.setdefault(spec.name, []).append(Offer(spec, impl.plugin_name))
        return offered

    def backend(self, name: str) -> BackendSpec:
        return self._lookup(self.backends, "backend", name).spec

    def algorithm(self, name: str) -> AlgorithmSpec:
        return self._lookup(self.algorithms, "algorithm", name).spec

    def _collect_flags(self, pm: WarcorePluginManager) -> dict[str, Offer[FlagSpec]]:
        flags = {name: Offer(spec, BUILTIN_PLUGIN_NAME) for name, spec in CORE_FLAGS.items()}
        offered = self._offers(pm, "warcore_engine_flags", FlagSpec)
        for name, candidates in sorted(offered.items()):
            core = flags.get(name)
            everyone = ([core] if core is not None else []) + candidates
            meanings = {(o.spec.kind, o.spec.default, o.spec.bounds) for o in everyone}
            if len(meanings) == 1:
                flags.setdefault(name, candidates[0])
                continue
            who = " and ".join(
                f"{_describe(pm, o.plugin)!r} ({o.spec.kind.__name__}, default {o.spec.default!r})"
                for o in everyone
            )
            if core is not None:  # the core's meaning stays; the plugin's is ignored
                message = f"flag {name!r} is a core flag; declared differently by {who}"
            else:
                message = f"flag {name!r} is declared differently by {who}; it is disabled"
                self._flag_conflicts[name] = message
            self.problems.append(message)
            pm.log_once(("duplicate", "flag", name), logging.ERROR, message)
        return dict(sorted(flags.items()))

    def flag(self, name: str) -> FlagSpec:
        """The declared flag ``name``; unknown names list the valid ones."""
        if name in self._flag_conflicts:
            raise DuplicateNameError(self._flag_conflicts[name])
        if name not in self.flags:
            check_flags({name: None}, self.flag_specs())  # raises, naming the valid ones
        return self.flags[name].spec

    def flag_specs(self) -> dict[str, FlagSpec]:
        """Every usable flag by name (what ``--flag`` and ``EngineConfig.flags`` accept)."""
        return {name: offer.spec for name, offer in self.flags.items()}

    def check_flags(
        self, flags: dict[str, object] | tuple[tuple[str, object], ...]
    ) -> dict[str, FlagValue]:
        """``flags`` checked against the declared set: :class:`ValueError` naming a flag that
        is unknown, disabled, or set to a value of the wrong kind."""
        items = flags.items() if isinstance(flags, dict) else flags
        for name, _ in items:
            if name in self._flag_conflicts:
                raise DuplicateNameError(self._flag_conflicts[name])
        return check_flags(flags, self.flag_specs())

    def _lookup(self, table: dict[str, Offer[S]], label: str, name: str) -> Offer[S]:
        if name in table:
            return table[name]
        if f"{label}:{name}" in self._duplicates:
            raise DuplicateNameError(self._duplicates[f"{label}:{name}"])
        valid = ", ".join(sorted(table)) or "(none)"
        raise UnknownNameError(f"unknown {label} {name!r}; valid: {valid}")


def _log_failure(
    pm: WarcorePluginManager, plugin: str, hook: str, exc: BaseException, message: str
) -> None:
    """Once per (plugin, hook, reason) in the process, like a resolution failure."""
    pm.log_once(("failed", plugin, hook, failure_text(exc)), logging.WARNING, message)


def _describe(pm: WarcorePluginManager, plugin: str) -> str:
    """``plugin (distribution)`` when the plugin came from an installed distribution."""
    for info in pm.plugin_infos:
        if info.name == plugin and info.distribution:
            return f"{plugin} ({info.distribution})"
    return plugin


def get_registry(pm: WarcorePluginManager) -> Registry:
    """The registry for ``pm``'s current generation (rebuilt after register/unregister)."""
    reg = pm.cached_registry
    if isinstance(reg, Registry) and reg.generation == pm.generation:
        return reg
    # A plugin's spec hook may register another plugin while the registry is collected:
    # collect again (a few times at most) so that the registry includes it.
    fresh = Registry(pm)
    for _ in range(2):
        if fresh.generation == pm.generation:
            break
        fresh = Registry(pm)
    pm.cached_registry = fresh
    return fresh
