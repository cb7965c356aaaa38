"""The plugin manager: pluggy's, plus loading with failure isolation, change notification, and
one way to ask a hookimpl on its own."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

import pluggy

from ._config import ENV_PLUGINS, ENV_STRICT_PLUGINS, LoaderConfig
from ._diagnostics import (
    PLUGIN_ERRORS,
    PluginInfo,
    PluginValidationError,
    failure_text,
    hook_problems,
    source_path,
)
from ._hookspecs import PROJECT_NAME, WarcoreSpecs
from ._select import BUILTIN_PLUGIN_NAME, Candidate, select_entry_points

__all__ = [
    "BUILTIN_MODULE",
    "ENTRY_POINT_GROUP",
    "PluginLoadError",
    "PluginReentryError",
    "WarcorePluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
]

logger = logging.getLogger("warcore.plugins")

T = TypeVar("T")

ENTRY_POINT_GROUP = PROJECT_NAME
BUILTIN_MODULE = "warcore.engine.builtin_plugin"
"""The module registered as the core's own plugin (``warcore``): the reference engine's
backends, algorithms and vetoes. Named, not imported: it lives in the layers whose classes it
registers, above the core, and imports none of them until a backend is built."""

REGISTERED_BY_ENTRY_POINT = "entry point"
REGISTERED_BY_CORE = "core"
REGISTERED_BY_RUNTIME = "runtime"


class PluginLoadError(RuntimeError):
    """A plugin failed to load and ``WARCORE_STRICT_PLUGINS=1`` asked for an error."""


class PluginReentryError(RuntimeError):
    """A plugin used the process-wide manager (``warcore.get_plugin_manager()`` or
    ``reset_plugin_manager()``) while that manager was importing it."""


class WarcorePluginManager(pluggy.PluginManager):
    """A pluggy manager that knows what it loaded, and tells listeners when plugins change.

    ``builtins``: the core's own plugin, registered as ``warcore``: ``True`` for
    :data:`BUILTIN_MODULE`, a module's dotted name for another, ``False`` for none.
    """

    SLOW_PLUGIN_SECONDS = 1.0
    """A plugin whose loading (import, registration, validation) takes longer than this is
    warned about, naming it: every warcore process waits for it. ``warcore plugins`` shows
    each load time."""

    def __init__(self, config: LoaderConfig | None = None, *, builtins: bool | str = True) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(WarcoreSpecs)
        self._change_lock = threading.RLock()
        """Held across every change of the plugin set or the configuration, with its
        bookkeeping (listing, generation, listeners): each change is one atomic step."""
        self._local = threading.local()  # per thread: whose hook runs, changes made (_changed)
        self._config = config if config is not None else LoaderConfig()
        self.plugin_infos: list[PluginInfo] = []
        self.unknown_allowlist_names: tuple[str, ...] = ()
        self.allowlist_problems: tuple[str, ...] = ()
        """An allowlist entry that names more than one distribution's plugin: none loaded."""
        self.generation = 0
        self.cached_registry: object = None
        self.cached_decisions: object = None
        self._listeners: list[Callable[[], None]] = []
        self._registering = False  # True while the loader registers (it records the info)
        self._plugin_modules: dict[str, str] = {}  # plugin name -> its module, for registered_by
        self._importing: str | None = None  # the entry point being imported, for re-entry
        self._reentry: PluginReentryError | None = None
        if builtins:
            self._register_builtins(BUILTIN_MODULE if builtins is True else builtins)

    def _register_builtins(self, module_name: str) -> None:
        start = time.perf_counter()
        module = importlib.import_module(module_name)
        self._unrecorded(lambda: self.register(module, BUILTIN_PLUGIN_NAME))
        info = self._info_for(BUILTIN_PLUGIN_NAME, module, "warcore", _own_version())
        load_ms = (time.perf_counter() - start) * 1e3
        self.plugin_infos.append(info.replace(registered_by=REGISTERED_BY_CORE, load_ms=load_ms))
        self._plugin_modules[BUILTIN_PLUGIN_NAME] = module.__name__

    # -- change notification -------------------------------------------------------------
    # Every change takes _change_lock for the change and its bookkeeping, so that two threads
    # changing plugins or switches at once neither lose an update (pluggy's own register and
    # unregister are read-modify-writes of its tables) nor count one twice or not at all.
    def register(self, plugin: object, name: str | None = None) -> str | None:
        with self._change_lock:
            caller = None if self._registering else self._registering_caller()
            result = super().register(plugin, name)
            if result is not None and caller is not None:
                self._record_runtime(result, plugin, caller)
            self._changed()
            return result

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        with self._change_lock:
            if name is None and plugin is not None:
                name = self.get_name(plugin)
            result = super().unregister(plugin, name)
            if name is not None and not self._registering:
                self._record_unregistered(name)
            self._changed()
            return result

    def unregister_registered_by(self, plugin: str) -> list[str]:
        """Unregister, as one change, every plugin ``plugin``'s code registered at run time
        that is still registered, and drop them from the listing: the helpers of a plugin
        blamed for changing the plugin set every time it is asked (they were never installed,
        and only kept its decisions from settling). Returns their names."""
        caller = f"plugin:{plugin}"
        with self._change_lock:
            helpers = [
                i.name
                for i in self.plugin_infos
                if i.registered_by == caller and i.status == "active"
            ]
            helpers = [name for name in helpers if self.get_plugin(name) is not None]
            for name in helpers:
                super().unregister(name=name)
            gone = set(helpers)
            self.plugin_infos = [
                i for i in self.plugin_infos if not (i.name in gone and i.registered_by == caller)
            ]
            if helpers:
                self._changed()
            return helpers

    def _unrecorded(self, change: Callable[[], object]) -> None:
        """Register or unregister a plugin the loader lists itself (no runtime info)."""
        with self._change_lock:
            self._registering = True
            try:
                change()
            finally:
                self._registering = False

    def _record_runtime(self, name: str, plugin: object, caller: str) -> None:
        """A plugin registered at run time (by a hook, a test, an engine): list it too."""
        info = self._info_for(name, plugin, None).replace(registered_by=caller)
        self.plugin_infos = [
            i
            for i in self.plugin_infos
            if not (i.name == name and i.status == "disabled" and i.value is None)
        ] + [info]

    def _record_unregistered(self, name: str) -> None:
        for k, info in enumerate(self.plugin_infos):
            if info.name == name and info.status == "active":
                self.plugin_infos[k] = info.replace(
                    status="disabled", error="unregistered at run time"
                )

    def _registering_caller(self) -> str:
        """``plugin:<name>`` when a plugin's hook is being asked on this thread, or a loaded
        plugin's code is on the stack (innermost first); ``core`` for the built-ins, else
        ``runtime``."""
        asking = getattr(self._local, "asking", None)
        modules = dict(self._plugin_modules)
        frame: Any = sys._getframe(2)  # _registering_caller <- register <- its caller
        while asking is None and frame is not None:
            where = frame.f_globals.get("__name__", "")
            for name, module in modules.items():
                if where == module or where.startswith(module + "."):
                    asking = (name, "")
                    break
            frame = frame.f_back
        if asking is None:
            return REGISTERED_BY_RUNTIME
        return REGISTERED_BY_CORE if asking[0] == BUILTIN_PLUGIN_NAME else f"plugin:{asking[0]}"

    @property
    def config(self) -> LoaderConfig:
        """The environment controls in force. Assigning a new one is a switch: atomic, and
        every cached decision follows (like :meth:`set_force_coarse`)."""
        return self._config

    @config.setter
    def config(self, new: LoaderConfig) -> None:
        if not isinstance(new, LoaderConfig):
            raise TypeError(f"config must be a warcore.LoaderConfig, got {new!r}")
        self._switch(lambda _: new)

    def set_force_coarse(self, on: bool) -> None:
        """Turn force-coarse on or off while the process runs: every cached decision follows on
        its runner's next replay, and every barrier reads the switch. Safe from any thread:
        a switch another thread turns at the same moment is not lost."""
        self._switch(lambda config: replace(config, force_coarse=bool(on)))

    def set_prefill_fast_path(self, on: bool) -> None:
        """Allow (or veto) prefill publishing before its replay, while the process runs (from
        any thread, like :meth:`set_force_coarse`)."""
        self._switch(lambda config: replace(config, prefill_fast_path=bool(on)))

    def _switch(self, change: Callable[[LoaderConfig], LoaderConfig]) -> None:
        """Read, change and write the configuration as one step (a switch turned by another
        thread between the read and the write would otherwise be lost)."""
        with self._change_lock:
            new = change(self._config)
            if new != self._config:
                self._config = new
                self._changed()

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a plugin is registered or unregistered or a switch
        changes (with the change's lock held: keep it short, and change nothing in it)."""
        with self._change_lock:
            self._listeners.append(listener)

    def remove_change_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (one registration of it; one that is not registered is
        ignored, so a shutdown path may call this twice)."""
        with self._change_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _changed(self) -> None:
        """One change (the lock is held): a new generation, the listeners told; noted for the
        thread that made it, against the plugin whose hook was being asked, if any."""
        self.generation += 1
        local = self._local
        local.changes = getattr(local, "changes", 0) + 1
        local.changed_by = getattr(local, "asking", None)
        for listener in list(self._listeners):
            listener()

    # -- asking plugins --------------------------------------------------------------------
    def call_hookimpl(self, hook: str, impl: pluggy.HookImpl, kwargs: Mapping[str, Any]) -> Any:
        """``impl``'s answer to ``hook`` on its own (``None``: it abstains), or its exception.

        The call goes through pluggy's hook execution, as ``pm.hook.<name>(...)`` does, so
        ``enable_tracing()`` and ``add_hookcall_monitoring()`` see every plugin asked; unlike
        that call, one plugin's raise or answer never touches another's. A wrapper is refused:
        asked alone it would wrap nothing."""
        if impl.hookwrapper or impl.wrapper:
            raise PluginValidationError(
                f"plugin {impl.plugin_name!r}: hook {hook!r} is a wrapper; warcore asks each "
                "plugin on its own, so implement it as a plain hookimpl"
            )
        execute = self._hookexec  # the path HookCaller.__call__ takes (pluggy 1.5 to 1.7)
        results = self.call_as(impl.plugin_name, hook, lambda: execute(hook, [impl], kwargs, False))
        return cast(list[Any], results)[0] if results else None

    def call_as(self, plugin: str, hook: str, function: Callable[..., T], **kwargs: Any) -> T:
        """``function(**kwargs)``: ``plugin``'s code for ``hook`` (a hookimpl, or a callable a
        plugin's spec carries). A change of the plugin set it makes on this thread is
        attributed to it (:meth:`changes_here`, and ``registered_by`` in the listing)."""
        local = self._local
        outer = getattr(local, "asking", None)
        local.asking = (plugin, hook)
        try:
            return function(**kwargs)
        finally:
            local.asking = outer

    def changes_here(self) -> tuple[int, tuple[str, str] | None]:
        """How many changes this thread has made, and (plugin, hook) of the code that made
        the last one, when it was a plugin's (see :meth:`call_as`)."""
        local = self._local
        return getattr(local, "changes", 0), getattr(local, "changed_by", None)

    def log_once(self, key: object, level: int, message: str) -> None:
        """Log ``message`` the first time ``key`` is seen in this process (by any manager)."""
        with _LOGGED_LOCK:
            if key in _LOGGED:
                return
            _LOGGED.add(key)
        logger.log(level, message)

    # -- validation ----------------------------------------------------------------------
    def check_pending(self) -> None:
        """Raise :class:`PluginValidationError` naming the plugin and its unknown hook."""
        for name, plugin in self.list_name_plugin():
            self._check_plugin(name, plugin)

    def _check_plugin(self, name: str, plugin: object) -> None:
        problems = hook_problems(self, name, plugin)
        if problems:
            raise PluginValidationError("; ".join(problems))

    def _info_for(
        self, name: str, plugin: object, distribution: str | None, version: str | None = None
    ) -> PluginInfo:
        hooks = tuple(sorted(h.name for h in self.get_hookcallers(plugin) or ()))
        path = source_path(plugin)
        return PluginInfo(name, distribution, version, "active", hooks, path=path)

    # -- loading -------------------------------------------------------------------------
    def load_entry_points(self, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        """Load the ``warcore`` entry points one at a time, in sorted order, each isolated.

        Which ones (a pure function of the names decides, ``select_entry_points``): an entry
        of ``WARCORE_PLUGINS`` (the allowlist) or ``WARCORE_DISABLE_PLUGINS`` (the block list)
        is ``DIST:EP`` (exactly that distribution's entry point) or a bare ``NAME``, which stands
        for every entry point whose distribution is ``NAME`` or whose entry-point name is
        ``NAME``, provided those all belong to one distribution. A bare name that two
        distributions answer to is ambiguous: it admits none of them (reported in
        :attr:`allowlist_problems`) and blocks all of them. Names compare after PEP 503
        normalisation (case, and ``-``, ``_``, ``.`` alike). The lists are applied first; then
        an entry-point name that more than one admitted distribution offers loads from none
        of them (each is failed, naming the others); so a distribution that is not admitted
        never takes an admitted one's place.
        """
        if entry_points is None:
            entry_points = md.entry_points(group=ENTRY_POINT_GROUP)
        # Reading a distribution's metadata parses a file: once per entry point.
        found = [(ep, *_dist_info(ep)) for ep in entry_points]
        candidates = [Candidate(ep.name, dist) for ep, dist, _ in found]
        selection = select_entry_points(candidates, self.config.allowlist, self.config.blocked)
        if self.config.allowlist is not None:
            self.unknown_allowlist_names = selection.unknown
            self.allowlist_problems = selection.problems
        for name in selection.unknown:
            logger.warning(
                "%s names %r, but no installed warcore plugin has that entry-point or "
                "distribution name",
                ENV_PLUGINS,
                name,
            )
        for problem in selection.problems:
            logger.warning("%s", problem)
        for verdict in selection.verdicts:
            ep, dist, version = found[verdict.index]
            base = PluginInfo(ep.name, dist, version, "disabled", value=ep.value)
            if verdict.action == "load":
                self._load_one(ep, base)
            elif verdict.action == "failed":
                self._record_failure(base, verdict.reason or "", None)
            else:
                self.plugin_infos.append(base.replace(error=verdict.reason))

    def _load_one(self, ep: md.EntryPoint, base: PluginInfo) -> None:
        registered = False
        start = time.perf_counter()
        self._importing, self._reentry = ep.name, None
        try:
            plugin = ep.load()
            if self._reentry is not None:  # raised inside the import, even if swallowed there
                raise self._reentry
            self._unrecorded(lambda: self.register(plugin, ep.name))
            registered = True
            self._check_plugin(ep.name, plugin)
        except PLUGIN_ERRORS as exc:
            if registered:
                self._unrecorded(lambda: self.unregister(name=ep.name))
            load_ms = (time.perf_counter() - start) * 1e3
            base = base.replace(load_ms=load_ms, warnings=self._slow(base, load_ms))
            self._record_failure(base, failure_text(exc), exc)
            return
        finally:
            self._importing, self._reentry = None, None
        self._plugin_modules[ep.name] = ep.module
        load_ms = (time.perf_counter() - start) * 1e3
        info = self._info_for(ep.name, plugin, base.distribution, base.version)
        warnings = self._slow(base, load_ms)
        if not info.hooks:
            warning = (
                "registers no hook, so it does nothing (are its functions marked "
                "@warcore.hookimpl?)"
            )
            logger.warning(
                "warcore plugin %r (distribution %r) %s", ep.name, base.distribution, warning
            )
            warnings += (warning,)
        self.plugin_infos.append(info.replace(value=base.value, load_ms=load_ms, warnings=warnings))

    def _slow(self, base: PluginInfo, load_ms: float) -> tuple[str, ...]:
        """The slow-load warning (logged, and returned for the plugin's info), if any."""
        limit = self.SLOW_PLUGIN_SECONDS
        if load_ms <= limit * 1e3:
            return ()
        warning = (
            f"slow to load: {load_ms / 1e3:.2f} s (more than {limit:g} s); "
            "every warcore process waits for it"
        )
        logger.warning(
            "warcore plugin %r (distribution %r) is %s", base.name, base.distribution, warning
        )
        return (warning,)

    def _record_failure(self, base: PluginInfo, error: str, exc: BaseException | None) -> None:
        self.plugin_infos.append(base.replace(status="failed", error=error))
        message = (
            f"warcore plugin {base.name!r} (distribution {base.distribution!r}) failed to load "
            f"and was skipped: {error}"
        )
        if self.config.strict:
            raise PluginLoadError(f"{message} [{ENV_STRICT_PLUGINS}=1]") from exc
        logger.warning(message)

    @property
    def failed_plugins(self) -> list[PluginInfo]:
        return [p for p in self.plugin_infos if p.status == "failed"]


_LOGGED: set[object] = set()
_LOGGED_LOCK = threading.Lock()


def _own_version() -> str | None:
    try:
        return md.version("warcore")
    except md.PackageNotFoundError:  # running from a source tree that is not installed
        return None


def _dist_info(ep: md.EntryPoint) -> tuple[str | None, str | None]:
    """The entry point's distribution name and version, from one read of its metadata."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    meta = dist.metadata
    return str(meta["Name"]) or None, str(meta["Version"])


_manager: WarcorePluginManager | None = None
_building: WarcorePluginManager | None = None
"""The process-wide manager while its entry points load (only the loading thread, which holds
the lock, can see it set)."""
_manager_lock = threading.RLock()


def _refuse_reentry(call: str) -> None:
    pm = _building
    assert pm is not None
    who = f"warcore plugin {pm._importing!r}" if pm._importing else "a warcore plugin"
    error = PluginReentryError(
        f"{who} called warcore.{call}() while it was being imported: the process-wide plugin "
        f"manager is being built then (by loading that plugin). Call {call}() from inside a "
        "hook instead; the plugin is not loaded"
    )
    pm._reentry = error
    raise error


def get_plugin_manager() -> WarcorePluginManager:
    """The process-wide manager, built on first use from the environment and entry points.

    Another thread waits while it is built; a plugin that calls this while it is being
    imported (by that build) gets :class:`PluginReentryError`, and fails to load.
    """
    global _manager, _building
    with _manager_lock:
        if _building is not None:
            _refuse_reentry("get_plugin_manager")
        if _manager is None:
            pm = WarcorePluginManager(LoaderConfig.from_env())
            _building = pm
            try:
                pm.load_entry_points()
            finally:
                _building = None
            _manager = pm
        return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (and its caches); the next call rereads everything."""
    global _manager
    with _manager_lock:
        if _building is not None:
            _refuse_reentry("reset_plugin_manager")
        _manager = None
