"""The plugin manager: entry-point loading with failure isolation, and environment controls."""

from __future__ import annotations

import difflib
import importlib.metadata as md
import inspect
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pluggy

from ._hookspecs import PROJECT_NAME, WarcoreSpecs

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_DISABLE_PLUGINS",
    "ENV_FORCE_COARSE",
    "ENV_PLUGINS",
    "ENV_PREFILL_FAST_PATH",
    "ENV_STRICT_PLUGINS",
    "BUILTIN_PLUGIN_NAME",
    "SLOW_PLUGIN_SECONDS",
    "LoaderConfig",
    "PluginInfo",
    "PluginLoadError",
    "PluginReentryError",
    "PluginValidationError",
    "WarcorePluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
]

logger = logging.getLogger("warcore.plugins")

T = TypeVar("T")

ENTRY_POINT_GROUP = PROJECT_NAME
ENV_PLUGINS = "WARCORE_PLUGINS"
ENV_DISABLE_PLUGINS = "WARCORE_DISABLE_PLUGINS"
ENV_STRICT_PLUGINS = "WARCORE_STRICT_PLUGINS"
ENV_FORCE_COARSE = "WARCORE_FORCE_COARSE"
ENV_PREFILL_FAST_PATH = "WARCORE_PREFILL_FAST_PATH"
BUILTIN_PLUGIN_NAME = "warcore"
SLOW_PLUGIN_SECONDS = 1.0
"""A plugin whose loading (import, registration, validation) takes longer than this is warned
about, naming it: every warcore process waits for it. ``warcore plugins`` shows each load time."""

PluginStatus = Literal["active", "disabled", "failed"]

REGISTERED_BY_ENTRY_POINT = "entry point"
REGISTERED_BY_CORE = "core"
REGISTERED_BY_RUNTIME = "runtime"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_PLUGIN_NAME = re.compile(rf"^{_NAME}(:{_NAME})?$")


class PluginLoadError(RuntimeError):
    """A plugin failed to load and ``WARCORE_STRICT_PLUGINS=1`` asked for an error."""


class PluginValidationError(ValueError):
    """A plugin implements something warcore does not know (a misspelled hook, say)."""


class PluginReentryError(RuntimeError):
    """A plugin used the process-wide manager (``warcore.get_plugin_manager()`` or
    ``reset_plugin_manager()``) while that manager was importing it."""


def _canonical(name: str) -> str:
    """PEP 503 normalisation, so ``warcore_dflash`` matches ``warcore-dflash``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_bool(environ: Mapping[str, str], var: str, default: bool = False) -> bool:
    if var not in environ:
        return default
    raw = environ[var]
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _env_names(environ: Mapping[str, str], var: str) -> frozenset[str] | None:
    if var not in environ:
        return None
    raw = environ[var]
    names = [n.strip() for n in raw.split(",")]
    names = [n for n in names if n]
    if not names and raw.strip():
        empty = "load no plugin" if var == ENV_PLUGINS else "block no plugin"
        raise ValueError(f"{var}={raw!r} names no plugin; to {empty}, set it empty ({var}=)")
    for name in names:
        if not _PLUGIN_NAME.match(name):
            raise ValueError(
                f"{var}={raw!r}: {name!r} is not a plugin or distribution name "
                "(NAME or DISTRIBUTION:ENTRY_POINT)"
            )
    return frozenset(names)


@dataclass(frozen=True)
class LoaderConfig:
    """The environment controls, read once when a manager is built.

    ``allowlist``: ``None`` loads every plugin, an empty set loads none; see
    :meth:`WarcorePluginManager.load_entry_points` for how an entry (of it or of ``blocked``)
    matches a plugin. ``force_coarse`` and ``prefill_fast_path`` are run-time switches too:
    change them with :meth:`WarcorePluginManager.set_force_coarse` /
    :meth:`~WarcorePluginManager.set_prefill_fast_path`.
    """

    allowlist: frozenset[str] | None = None
    blocked: frozenset[str] = frozenset()
    strict: bool = False
    force_coarse: bool = False
    prefill_fast_path: bool = True
    """Prefill may publish before its replay (sglang's ``SGLANG_ENABLE_PREFILL_WAR_READ_DONE``,
    opt-in there; on here, where the sanitizer audits every prefill declaration)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoaderConfig:
        env = os.environ if environ is None else environ
        return cls(
            allowlist=_env_names(env, ENV_PLUGINS),
            blocked=_env_names(env, ENV_DISABLE_PLUGINS) or frozenset(),
            strict=_env_bool(env, ENV_STRICT_PLUGINS),
            force_coarse=_env_bool(env, ENV_FORCE_COARSE),
            prefill_fast_path=_env_bool(env, ENV_PREFILL_FAST_PATH, default=True),
        )


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
    registered_by: str = REGISTERED_BY_ENTRY_POINT
    """``entry point``, ``core`` (the built-ins), ``plugin:<name>`` (registered at run time by
    that plugin's code) or ``runtime`` (registered at run time by anything else)."""
    load_ms: float | None = None
    """Import, registration and validation, in ms (``None``: not loaded from an entry point)."""
    warnings: tuple[str, ...] = ()

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


def _source_path(plugin: object) -> str | None:
    """The file the plugin (a module or class, else its class) was defined in; ``None`` where
    there is none: a built-in, or code typed into ``python -c``, a REPL or a notebook cell
    (``inspect`` raises ``OSError`` for a class of ``__main__`` without a file)."""
    for candidate in (plugin, type(plugin)):
        try:
            return inspect.getfile(candidate)  # type: ignore[arg-type]
        except (TypeError, OSError):
            continue
    return None


class WarcorePluginManager(pluggy.PluginManager):
    """A pluggy manager that knows what it loaded, and tells listeners when plugins change."""

    def __init__(self, config: LoaderConfig | None = None, *, builtins: bool = True) -> None:
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
            start = time.perf_counter()
            from . import _builtins

            self._register_loaded(_builtins, BUILTIN_PLUGIN_NAME)
            info = self._info_for(BUILTIN_PLUGIN_NAME, _builtins, "warcore", _own_version())
            self.plugin_infos.append(
                _replace(
                    info,
                    registered_by=REGISTERED_BY_CORE,
                    load_ms=(time.perf_counter() - start) * 1e3,
                )
            )
            self._plugin_modules[BUILTIN_PLUGIN_NAME] = _builtins.__name__

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

    def _register_loaded(self, plugin: object, name: str) -> None:
        """Register a plugin the loader records itself (no runtime info)."""
        with self._change_lock:
            self._registering = True
            try:
                self.register(plugin, name=name)
            finally:
                self._registering = False

    def _unregister_loaded(self, name: str) -> None:
        with self._change_lock:
            self._registering = True
            try:
                self.unregister(name=name)
            finally:
                self._registering = False

    def _record_runtime(self, name: str, plugin: object, caller: str) -> None:
        """A plugin registered at run time (by a hook, a test, an engine): list it too."""
        info = _replace(self._info_for(name, plugin, None), registered_by=caller)
        self.plugin_infos = [
            i
            for i in self.plugin_infos
            if not (i.name == name and i.status == "disabled" and i.value is None)
        ] + [info]

    def _record_unregistered(self, name: str) -> None:
        for k, info in enumerate(self.plugin_infos):
            if info.name == name and info.status == "active":
                self.plugin_infos[k] = _replace(
                    info, status="disabled", error="unregistered at run time"
                )

    def _registering_caller(self) -> str:
        """``plugin:<name>`` when a plugin's hook is being asked on this thread, or a loaded
        plugin's code is on the stack (innermost first); ``core`` for the built-ins, else
        ``runtime``."""
        asking = getattr(self._local, "asking", None)
        if asking is not None:
            name = asking[0]
            return REGISTERED_BY_CORE if name == BUILTIN_PLUGIN_NAME else f"plugin:{name}"
        modules = dict(self._plugin_modules)
        frame: Any = sys._getframe(2)  # _registering_caller <- register <- its caller
        while frame is not None:
            where = frame.f_globals.get("__name__", "")
            for name, module in modules.items():
                if where == module or where.startswith(module + "."):
                    if name == BUILTIN_PLUGIN_NAME:
                        return REGISTERED_BY_CORE
                    return f"plugin:{name}"
            frame = frame.f_back
        return REGISTERED_BY_RUNTIME

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
        self._switch(lambda config: _replace_config(config, force_coarse=bool(on)))

    def set_prefill_fast_path(self, on: bool) -> None:
        """Allow (or veto) prefill publishing before its replay, while the process runs (from
        any thread, like :meth:`set_force_coarse`)."""
        self._switch(lambda config: _replace_config(config, prefill_fast_path=bool(on)))

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

    # -- logging -------------------------------------------------------------------------
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
        unmarked = self._unmarked_hooks(name, plugin)
        if unmarked:
            raise PluginValidationError("; ".join(unmarked))
        for hookcaller in self.get_hookcallers(plugin) or ():
            if hookcaller.spec is None:
                raise PluginValidationError(
                    f"plugin {name!r} implements unknown hook {hookcaller.name!r}; "
                    f"known hooks: {', '.join(sorted(_KNOWN_HOOKS))}"
                )
            for impl in hookcaller.get_hookimpls():
                if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                    raise PluginValidationError(
                        f"plugin {name!r}: hook {hookcaller.name!r} is a wrapper; warcore asks "
                        "each plugin on its own, so implement it as a plain hookimpl"
                    )

    def _unmarked_hooks(self, name: str, plugin: object) -> list[str]:
        """``warcore_*`` functions of ``plugin`` that pluggy would silently ignore: not marked
        ``@warcore.hookimpl`` (whether or not the name is a hook)."""
        problems = []
        for attr in sorted(dir(plugin)):
            if not attr.startswith("warcore_"):
                continue
            try:
                value = getattr(plugin, attr)
            except Exception:  # a property that raises: not a function anyway
                continue
            if not inspect.isroutine(value) or self.parse_hookimpl_opts(plugin, attr) is not None:
                continue
            if attr in _KNOWN_HOOKS:
                problems.append(
                    f"plugin {name!r}: function {attr!r} is not marked @warcore.hookimpl, so "
                    "warcore would never call it"
                )
            else:
                close = difflib.get_close_matches(attr, sorted(_KNOWN_HOOKS), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(
                    f"plugin {name!r}: function {attr!r} is not a warcore hook{hint} and is not "
                    f"marked @warcore.hookimpl; known hooks: {', '.join(sorted(_KNOWN_HOOKS))}"
                )
        return problems

    def _info_for(
        self, name: str, plugin: object, distribution: str | None, version: str | None = None
    ) -> PluginInfo:
        hooks = tuple(sorted(h.name for h in self.get_hookcallers(plugin) or ()))
        return PluginInfo(
            name=name,
            distribution=distribution,
            version=version,
            status="active",
            hooks=hooks,
            path=_source_path(plugin),
        )

    # -- loading -------------------------------------------------------------------------
    def load_entry_points(self, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        """Load the ``warcore`` entry points one at a time, in sorted order, each isolated.

        Which ones: an entry of ``WARCORE_PLUGINS`` (the allowlist) or ``WARCORE_DISABLE_PLUGINS``
        (the block list) is ``DIST:EP`` (exactly that distribution's entry point) or a bare
        ``NAME``, which stands for every entry point whose distribution is ``NAME`` or whose
        entry-point name is ``NAME``, provided those all belong to one distribution. A bare name
        that two distributions answer to is ambiguous: it admits none of them (reported in
        :attr:`allowlist_problems`) and blocks all of them. Names compare after PEP 503
        normalisation (case, and ``-``, ``_``, ``.`` alike). The lists are applied first; then
        an entry-point name that more than one admitted distribution offers loads from none
        of them (each is failed, naming the others); so a distribution that is not admitted
        never takes an admitted one's place.
        """
        if entry_points is None:
            entry_points = md.entry_points(group=ENTRY_POINT_GROUP)
        # Reading a distribution's metadata parses a file: once per entry point.
        found = sorted(
            (
                ((ep.name, dist or ""), version, ep)
                for ep in entry_points
                for dist, version in [_dist_info(ep)]
            ),
            key=lambda p: p[0],
        )
        candidates = [(ep, dist or None, version) for (_, dist), version, ep in found]
        ids = [(_canonical(dist or ""), _canonical(ep.name)) for ep, dist, _ in candidates]

        allow = self.config.allowlist
        admitted: set[int] | None = None
        ambiguous_allow: dict[int, str] = {}
        if allow is not None:
            admitted = set()
            unknown, problems = [], []
            for entry in sorted(allow):
                matches, dists = _matches(entry, ids)
                if not matches:
                    unknown.append(entry)
                elif len(dists) > 1:
                    owners = ", ".join(sorted(repr(d or "?") for d in dists))
                    problems.append(
                        f"{ENV_PLUGINS} names {entry!r}, which plugins of several distributions "
                        f"answer to ({owners}): none of them is loaded; name one as "
                        "DISTRIBUTION:ENTRY_POINT or by its distribution name"
                    )
                    for k in matches:
                        ambiguous_allow.setdefault(k, entry)
                else:
                    admitted |= matches
            self.unknown_allowlist_names = tuple(unknown)
            self.allowlist_problems = tuple(problems)
            for name in unknown:
                logger.warning(
                    "%s names %r, but no installed warcore plugin has that entry-point or "
                    "distribution name",
                    ENV_PLUGINS,
                    name,
                )
            for problem in problems:
                logger.warning("%s", problem)
        blocked: set[int] = set()
        for entry in self.config.blocked:
            blocked |= _matches(entry, ids)[0]  # ambiguous or not: block every match

        usable: list[tuple[int, PluginInfo]] = []
        for k, (ep, dist, version) in enumerate(candidates):
            base = PluginInfo(
                name=ep.name, distribution=dist, version=version, status="disabled", value=ep.value
            )
            if admitted is not None and k not in admitted:
                why = (
                    f"{ENV_PLUGINS} entry {ambiguous_allow[k]!r} is ambiguous"
                    if k in ambiguous_allow
                    else f"not listed in {ENV_PLUGINS}"
                )
                self.plugin_infos.append(_replace(base, error=why))
                continue
            if k in blocked:
                self.plugin_infos.append(_replace(base, error=f"blocked by {ENV_DISABLE_PLUGINS}"))
                continue
            if ep.name == BUILTIN_PLUGIN_NAME:
                self._record_failure(
                    base,
                    f"entry-point name {ep.name!r} is the core's own plugin name; not loaded",
                    None,
                )
                continue
            usable.append((k, base))
        by_name: dict[str, list[PluginInfo]] = {}
        for _, base in usable:
            by_name.setdefault(base.name, []).append(base)
        for k, base in usable:
            twins = by_name[base.name]
            if len(twins) > 1:
                who = " and ".join(repr(t.distribution) for t in twins)
                self._record_failure(
                    base,
                    f"duplicate entry point name {base.name!r}: distributions {who}; none of "
                    f"them is loaded (choose one with {ENV_PLUGINS}=DISTRIBUTION:ENTRY_POINT, or "
                    f"block the others with {ENV_DISABLE_PLUGINS})",
                    None,
                )
                continue
            self._load_one(candidates[k][0], base)

    def _load_one(self, ep: md.EntryPoint, base: PluginInfo) -> None:
        registered = False
        start = time.perf_counter()
        self._importing, self._reentry = ep.name, None
        try:
            plugin = ep.load()
            if self._reentry is not None:  # raised inside the import, even if swallowed there
                raise self._reentry
            self._register_loaded(plugin, ep.name)
            registered = True
            self._check_plugin(ep.name, plugin)
        except Exception as exc:
            if registered:
                self._unregister_loaded(ep.name)
            load_ms = (time.perf_counter() - start) * 1e3
            base = _replace(base, load_ms=load_ms, warnings=self._slow(base, load_ms))
            self._record_failure(base, f"{type(exc).__name__}: {exc}", exc)
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
        self.plugin_infos.append(
            _replace(info, value=base.value, load_ms=load_ms, warnings=warnings)
        )

    def _slow(self, base: PluginInfo, load_ms: float) -> tuple[str, ...]:
        """The slow-load warning (logged, and returned for the plugin's info), if any."""
        if load_ms <= SLOW_PLUGIN_SECONDS * 1e3:
            return ()
        warning = (
            f"slow to load: {load_ms / 1e3:.2f} s (more than {SLOW_PLUGIN_SECONDS:g} s); "
            "every warcore process waits for it"
        )
        logger.warning(
            "warcore plugin %r (distribution %r) is %s", base.name, base.distribution, warning
        )
        return (warning,)

    def _record_failure(self, base: PluginInfo, error: str, exc: BaseException | None) -> None:
        self.plugin_infos.append(_replace(base, status="failed", error=error))
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

_KNOWN_HOOKS = frozenset(n for n in vars(WarcoreSpecs) if n.startswith("warcore_"))


def _replace(info: PluginInfo, **changes: Any) -> PluginInfo:
    from dataclasses import replace

    return replace(info, **changes)


def _replace_config(config: LoaderConfig, **changes: bool) -> LoaderConfig:
    from dataclasses import replace

    return replace(config, **changes)  # type: ignore[arg-type]


def _own_version() -> str | None:
    try:
        return md.version("warcore")
    except md.PackageNotFoundError:  # running from a source tree that is not installed
        return None


def _matches(entry: str, ids: list[tuple[str, str]]) -> tuple[set[int], set[str]]:
    """The candidates (indices into ``ids``, canonical (distribution, entry point) pairs) an
    allowlist or block-list entry names, and their distributions."""
    if ":" in entry:
        dist, _, name = entry.partition(":")
        want = (_canonical(dist), _canonical(name))
        found = {k for k, pair in enumerate(ids) if pair == want}
    else:
        key = _canonical(entry)
        found = {k for k, (dist, name) in enumerate(ids) if key in (dist, name)}
    return found, {ids[k][0] for k in found}


def _dist_info(ep: md.EntryPoint) -> tuple[str | None, str | None]:
    """The entry point's distribution name and version, from one read of its metadata."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    meta = dist.metadata
    return str(meta["Name"]), str(meta["Version"])


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
