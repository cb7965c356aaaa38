"""The plugin manager: entry-point loading with failure isolation, and environment controls."""

from __future__ import annotations

import importlib.metadata as md
import inspect
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
    "LoaderConfig",
    "PluginInfo",
    "PluginLoadError",
    "PluginValidationError",
    "WarcorePluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
]

logger = logging.getLogger("warcore.plugins")

ENTRY_POINT_GROUP = PROJECT_NAME
ENV_PLUGINS = "WARCORE_PLUGINS"
ENV_DISABLE_PLUGINS = "WARCORE_DISABLE_PLUGINS"
ENV_STRICT_PLUGINS = "WARCORE_STRICT_PLUGINS"
ENV_FORCE_COARSE = "WARCORE_FORCE_COARSE"
ENV_PREFILL_FAST_PATH = "WARCORE_PREFILL_FAST_PATH"
BUILTIN_PLUGIN_NAME = "warcore"

PluginStatus = Literal["active", "disabled", "failed"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_PLUGIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class PluginLoadError(RuntimeError):
    """A plugin failed to load and ``WARCORE_STRICT_PLUGINS=1`` asked for an error."""


class PluginValidationError(ValueError):
    """A plugin implements something warcore does not know (a misspelled hook, say)."""


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
    names = [n.strip() for n in environ[var].split(",")]
    names = [n for n in names if n]
    for name in names:
        if not _PLUGIN_NAME.match(name):
            raise ValueError(
                f"{var}={environ[var]!r}: {name!r} is not a plugin or distribution name"
            )
    return frozenset(names)


@dataclass(frozen=True)
class LoaderConfig:
    """The environment controls, read once when a manager is built.

    ``allowlist``: ``None`` loads every plugin, an empty set loads none. ``force_coarse`` and
    ``prefill_fast_path`` are run-time switches too: change them with
    :meth:`WarcorePluginManager.set_force_coarse` / :meth:`~WarcorePluginManager.set_prefill_fast_path`.
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
        }


def _source_path(plugin: object) -> str | None:
    try:
        return inspect.getfile(plugin)  # type: ignore[arg-type]
    except TypeError:
        try:
            return inspect.getfile(type(plugin))
        except TypeError:
            return None


class WarcorePluginManager(pluggy.PluginManager):
    """A pluggy manager that knows what it loaded, and tells listeners when plugins change."""

    def __init__(self, config: LoaderConfig | None = None, *, builtins: bool = True) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(WarcoreSpecs)
        self.config = config if config is not None else LoaderConfig()
        self.plugin_infos: list[PluginInfo] = []
        self.unknown_allowlist_names: tuple[str, ...] = ()
        self.generation = 0
        self.cached_registry: object = None
        self.cached_decisions: object = None
        self._listeners: list[Callable[[], None]] = []
        if builtins:
            from . import _builtins

            self.register(_builtins, name=BUILTIN_PLUGIN_NAME)
            info = self._info_for(BUILTIN_PLUGIN_NAME, _builtins, "warcore", _own_version())
            self.plugin_infos.append(info)

    # -- change notification -------------------------------------------------------------
    def register(self, plugin: object, name: str | None = None) -> str | None:
        result = super().register(plugin, name)
        self._changed()
        return result

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        result = super().unregister(plugin, name)
        self._changed()
        return result

    def set_force_coarse(self, on: bool) -> None:
        """Turn force-coarse on or off while the process runs: every cached decision follows on
        its runner's next replay, and every barrier reads the switch."""
        self._switch(force_coarse=bool(on))

    def set_prefill_fast_path(self, on: bool) -> None:
        """Allow (or veto) prefill publishing before its replay, while the process runs."""
        self._switch(prefill_fast_path=bool(on))

    def _switch(self, **changes: bool) -> None:
        from dataclasses import replace

        new = replace(self.config, **changes)
        if new != self.config:
            self.config = new
            self._changed()

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a plugin is registered or unregistered."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        self.generation += 1
        for listener in list(getattr(self, "_listeners", ())):
            listener()

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
        """Load the ``warcore`` entry points one at a time, in sorted order, each isolated."""
        if entry_points is None:
            entry_points = md.entry_points(group=ENTRY_POINT_GROUP)
        # Reading a distribution's metadata parses a file: once per entry point.
        named = sorted(
            (
                ((ep.name, dist or ""), version, ep)
                for ep in entry_points
                for dist, version in [_dist_info(ep)]
            ),
            key=lambda p: p[0],
        )
        allow = self.config.allowlist
        allow_canon = None if allow is None else {_canonical(n) for n in allow}
        blocked_canon = {_canonical(n) for n in self.config.blocked}
        matched: set[str] = set()
        owners: dict[str, str | None] = {}
        for (_, dist_or_empty), version, ep in named:
            dist = dist_or_empty or None
            keys = {_canonical(ep.name)} | ({_canonical(dist)} if dist else set())
            base = PluginInfo(
                name=ep.name,
                distribution=dist,
                version=version,
                status="disabled",
                value=ep.value,
            )
            if ep.name in owners:
                error = (
                    f"duplicate entry point name {ep.name!r}: distributions "
                    f"{owners[ep.name]!r} and {dist!r}; only the first is loaded"
                )
                self._record_failure(base, error, None)
                continue
            owners[ep.name] = dist
            if allow_canon is not None:
                matched |= keys & allow_canon
                if not keys & allow_canon:
                    self.plugin_infos.append(_replace(base, error=f"not listed in {ENV_PLUGINS}"))
                    self.set_blocked(ep.name)
                    continue
            if keys & blocked_canon:
                self.plugin_infos.append(_replace(base, error=f"blocked by {ENV_DISABLE_PLUGINS}"))
                self.set_blocked(ep.name)
                continue
            self._load_one(ep, base)
        if allow is not None:
            unknown = sorted(n for n in allow if _canonical(n) not in matched)
            self.unknown_allowlist_names = tuple(unknown)
            for name in unknown:
                logger.warning(
                    "%s names %r, but no installed warcore plugin has that entry-point or "
                    "distribution name",
                    ENV_PLUGINS,
                    name,
                )

    def _load_one(self, ep: md.EntryPoint, base: PluginInfo) -> None:
        registered = False
        try:
            plugin = ep.load()
            self.register(plugin, name=ep.name)
            registered = True
            self._check_plugin(ep.name, plugin)
        except Exception as exc:
            if registered:
                self.unregister(name=ep.name)
            self._record_failure(base, f"{type(exc).__name__}: {exc}", exc)
            return
        info = self._info_for(ep.name, plugin, base.distribution, base.version)
        self.plugin_infos.append(_replace(info, value=base.value))

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
    return str(meta["Name"]), str(meta["Version"])


_manager: WarcorePluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> WarcorePluginManager:
    """The process-wide manager, built on first use from the environment and entry points."""
    global _manager
    with _manager_lock:
        if _manager is None:
            pm = WarcorePluginManager(LoaderConfig.from_env())
            pm.load_entry_points()
            _manager = pm
        return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (and its caches); the next call rereads everything."""
    global _manager
    with _manager_lock:
        _manager = None
