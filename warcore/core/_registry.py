"""Backends and algorithms offered by plugins, indexed by name."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

from ._manager import WarcorePluginManager
from ._specs import AlgorithmSpec, BackendSpec

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError", "get_registry"]

logger = logging.getLogger("warcore.plugins")

S = TypeVar("S", BackendSpec, AlgorithmSpec)


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

    def _collect(
        self, pm: WarcorePluginManager, hook: str, kind: type[S], label: str
    ) -> dict[str, Offer[S]]:
        offered: dict[str, list[Offer[S]]] = {}
        for impl in getattr(pm.hook, hook).get_hookimpls():
            try:
                result = impl.function()
                specs = [] if result is None else list(result)
                for spec in specs:
                    if not isinstance(spec, kind):
                        raise TypeError(f"returned {spec!r}, expected {kind.__name__}")
            except Exception as exc:
                problem = f"plugin {impl.plugin_name!r} hook {hook!r} failed: {exc}"
                self.problems.append(problem)
                pm.log_once(("registry", hook, impl.plugin_name), logging.WARNING, problem)
                continue
            for spec in specs:
                offered.setdefault(spec.name, []).append(Offer(spec, impl.plugin_name))
        offers: dict[str, Offer[S]] = {}
        for name, candidates in sorted(offered.items()):
            if len(candidates) == 1:
                offers[name] = candidates[0]
                continue
            who = " and ".join(sorted(repr(_describe(pm, c.plugin)) for c in candidates))
            message = f"{label} {name!r} is offered by more than one plugin: {who}; it is disabled"
            self._duplicates[f"{label}:{name}"] = message
            self.problems.append(message)
            pm.log_once(("duplicate", label, name), logging.ERROR, message)
        return offers

    def backend(self, name: str) -> BackendSpec:
        return self._lookup(self.backends, "backend", name).spec

    def algorithm(self, name: str) -> AlgorithmSpec:
        return self._lookup(self.algorithms, "algorithm", name).spec

    def _lookup(self, table: dict[str, Offer[S]], label: str, name: str) -> Offer[S]:
        if name in table:
            return table[name]
        if f"{label}:{name}" in self._duplicates:
            raise DuplicateNameError(self._duplicates[f"{label}:{name}"])
        valid = ", ".join(sorted(table)) or "(none)"
        raise UnknownNameError(f"unknown {label} {name!r}; valid: {valid}")


def _describe(pm: WarcorePluginManager, plugin: str) -> str:
    """``plugin (distribution)`` when the plugin came from an installed distribution."""
    for info in pm.plugin_infos:
        if info.name == plugin and info.distribution:
            return f"{plugin} ({info.distribution})"
    return plugin


def get_registry(pm: WarcorePluginManager) -> Registry:
    """The registry for ``pm``'s current generation (rebuilt after register/unregister)."""
    reg = pm.cached_registry
    if not isinstance(reg, Registry) or reg.generation != pm.generation:
        reg = Registry(pm)
        pm.cached_registry = reg
    return reg
