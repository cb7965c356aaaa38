"""Helpers shared by the test modules: not tests, and never a test module imported by another.

``fake_dists`` (fake plugin distributions), ``engine`` (an independent oracle, test backends
and plugins for the engine), ``audit`` (backends and plugins for the sanitizer and tracer),
``cells`` (which tests a plugin-matrix cell runs, and what a test touched of the installed
plugins), and
here :func:`fresh_manager`, which builds a manager over the installed entry points (the test
kit's ``warcore.testing.make_plugin_manager`` builds one over the entry points it is told).
Fixtures are in ``tests/conftest.py``; pytest puts ``tests/`` on ``sys.path`` (``pythonpath``
in ``pyproject.toml``), which makes this package importable.
"""

from __future__ import annotations

from pathlib import Path

from warcore.core import LoaderConfig, PluginInfo, WarcorePluginManager

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the documentation some tests check lives there)."""


def fresh_manager(
    *plugins: object | tuple[str, object],
    config: LoaderConfig | None = None,
    entry_points: bool = True,
) -> WarcorePluginManager:
    """A new manager, never the process-wide one: the core's built-ins, the installed entry
    points ``config`` admits (all by default; none loaded when ``entry_points`` is false),
    then ``plugins`` registered in order, each under its class's name or, given as a
    ``(name, plugin)`` pair, under that name."""
    pm = WarcorePluginManager(config or LoaderConfig())
    if entry_points:
        pm.load_entry_points()  # importlib.metadata's real entry points
    for item in plugins:
        name, plugin = item if isinstance(item, tuple) else (type(item).__name__, item)
        pm.register(plugin, name=name)
    return pm


def plugin_infos(pm: WarcorePluginManager, name: str) -> list[PluginInfo]:
    """Every record ``pm`` keeps of a plugin called ``name`` (two distributions may offer one
    entry-point name)."""
    return [i for i in pm.plugin_infos if i.name == name]


def plugin_info(pm: WarcorePluginManager, name: str) -> PluginInfo:
    """The one record ``pm`` keeps of the plugin called ``name``."""
    matches = plugin_infos(pm, name)
    assert len(matches) == 1, pm.plugin_infos
    return matches[0]
