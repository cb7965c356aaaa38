"""The environment controls: which plugins load, strict loading, and the run-time switches."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ENV_DISABLE_PLUGINS",
    "ENV_FORCE_COARSE",
    "ENV_PLUGINS",
    "ENV_PREFILL_FAST_PATH",
    "ENV_STRICT_PLUGINS",
    "LoaderConfig",
]

ENV_PLUGINS = "WARCORE_PLUGINS"
ENV_DISABLE_PLUGINS = "WARCORE_DISABLE_PLUGINS"
ENV_STRICT_PLUGINS = "WARCORE_STRICT_PLUGINS"
ENV_FORCE_COARSE = "WARCORE_FORCE_COARSE"
ENV_PREFILL_FAST_PATH = "WARCORE_PREFILL_FAST_PATH"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_PLUGIN_NAME = re.compile(rf"^{_NAME}(:{_NAME})?$")


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
    """Prefill may publish before its replay. On by default, as in sglang: 0.5.23's
    ``SGLANG_ENABLE_PREFILL_WAR_READ_DONE`` defaults to true, and sglang main turns it into the
    opt-out ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER``."""

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
