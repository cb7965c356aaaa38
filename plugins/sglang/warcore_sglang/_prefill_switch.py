"""Which sglang switches decide whether the prefill may publish early: 0.5.23's, or main's too.

sglang 0.5.23 reads the opt-in ``SGLANG_ENABLE_PREFILL_WAR_READ_DONE`` (``EnvBool(True)`` in the
0.5.23 wheel: on unless set false) in its own prefill resolver; sglang main (#37958, open)
replaces it with the opt-out ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER`` (the prefill fast
path is on unless it is set true). The activation always calls sglang's own resolver first, so
the installed sglang's switch is always in force. ``WARCORE_SGLANG_PREFILL_SWITCH`` says
whether main's opt-out is read too: ``0.5.23`` (the default: only the installed sglang's own
switch) or ``main`` (its opt-out as well; on an sglang that already reads it, that is its own
reading). Either variable can only close the fast path: an operator's "off" always wins. Every
place that reads the switches (the patched prefill resolver, its provenance, the trace, the
sanitizer) goes through :func:`read_prefill_switch`, so they cannot disagree.

Standard library only: the trace and the sanitizer import this before warcore or sglang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT",
    "ENV_PREFILL_SWITCH",
    "OPT_IN",
    "OPT_OUT",
    "SWITCHES",
    "PrefillSwitch",
    "PrefillSwitchError",
    "fast_path_env",
    "prefill_switch_setting",
    "read_prefill_switch",
]

ENV_PREFILL_SWITCH = "WARCORE_SGLANG_PREFILL_SWITCH"
"""Whether the activation also reads sglang main's prefill opt-out: ``0.5.23`` (default: the
installed sglang's own switch only) or ``main``; any other value:
:func:`warcore_sglang.install` raises :class:`PrefillSwitchError`."""
OPT_IN = "SGLANG_ENABLE_PREFILL_WAR_READ_DONE"
"""sglang 0.5.23's switch: the prefill fast path is on while it reads true."""
OPT_OUT = "SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER"
"""sglang main's switch (#37958): the prefill fast path is on unless it reads true."""
DEFAULT = "0.5.23"
SWITCHES = {"0.5.23": OPT_IN, "main": OPT_OUT}
"""The setting's valid values -> the variable each one reads."""

# sglang's EnvBool.parse (srt/environ.py): lower-cased, not stripped.
_TRUE = frozenset({"true", "1", "yes", "y"})
_FALSE = frozenset({"false", "0", "no", "n"})


class PrefillSwitchError(ValueError):
    """``WARCORE_SGLANG_PREFILL_SWITCH`` holds a value that names no switch."""


@dataclass(frozen=True)
class PrefillSwitch:
    on: bool
    """Whether the switch lets the prefill publish early (then the declaration decides)."""
    source: str
    """The switch that decided, as a provenance: ``sglang:<VARIABLE> is on|off``."""
    warning: str | None = None
    """A one-line warning for the operator (an ignored or unreadable variable), or ``None``."""


def prefill_switch_setting(environ: Mapping[str, str]) -> str:
    """The setting in ``environ`` (unset or empty: :data:`DEFAULT`); raises
    :class:`PrefillSwitchError` naming the variable, the value and the valid values."""
    raw = environ.get(ENV_PREFILL_SWITCH, "")
    value = raw.strip().lower()
    if not value:
        return DEFAULT
    if value not in SWITCHES:
        valid = ", ".join(f"{k!r} ({v})" for k, v in SWITCHES.items())
        raise PrefillSwitchError(
            f"{ENV_PREFILL_SWITCH}={raw!r} names no prefill switch; valid values: {valid}; "
            f"unset means {DEFAULT!r}"
        )
    return value


def read_prefill_switch(setting: str, environ: Mapping[str, str], envs: Any) -> PrefillSwitch:
    """Whether the switch ``setting`` names lets the prefill publish early. ``envs`` is sglang's
    ``srt.environ.envs``: the 0.5.23 variable is read through it (its default and its parsing,
    exactly as sglang's own resolver); the main variable through it where this sglang knows
    it, else from ``environ`` with sglang's boolean parsing (``envs`` may be ``None`` under
    ``main``: sglang's ``environ`` module not imported yet)."""
    if setting == "0.5.23":
        on = bool(getattr(envs, OPT_IN).get())
        return PrefillSwitch(on, f"sglang:{OPT_IN} is {'on' if on else 'off'}")
    if setting != "main":
        raise PrefillSwitchError(f"unknown prefill switch setting {setting!r}")
    warning = None
    if hasattr(envs, OPT_OUT):  # a sglang that knows the variable: its own reading
        coarse = bool(getattr(envs, OPT_OUT).get())
    else:
        raw = environ.get(OPT_OUT)
        value = None if raw is None else raw.lower()
        coarse = value in _TRUE
        if value is not None and value not in _TRUE | _FALSE:
            # sglang would warn and take its default (off: fast path on); an opt-out the
            # operator typed wrong is taken as set instead, the side that cannot race
            coarse = True
            warning = (
                f"warcore-sglang: {OPT_OUT}={raw!r} is not a boolean sglang reads "
                f"({', '.join(sorted(_TRUE | _FALSE))}): taken as set (coarse prefill)"
            )
    source = f"sglang:{OPT_OUT} is {'on' if coarse else 'off'}"
    return PrefillSwitch(not coarse, source, warning)


def fast_path_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a run that audits early prefill declarations sets so that sglang's own
    switch lets them publish, unless ``environ`` (the caller's, inherited) already says
    otherwise: 0.5.23's opt-in set ``1`` where unset (main's opt-out is off unless set)."""
    return {OPT_IN: environ.get(OPT_IN, "1")}
