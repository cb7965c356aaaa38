"""warcore-sglang's settings, read from the environment: the rank check's two, and which sglang
switches decide whether the prefill may publish early (the spelling of a switch and of a number
of seconds is warcore's, :mod:`warcore.integration.settings`).

**The prefill switch.** Every audited sglang reads the opt-in
``SGLANG_ENABLE_PREFILL_WAR_READ_DONE`` (``EnvBool(True)`` in 0.5.23: on unless set false;
``EnvBool(False)`` in 0.5.21 and 0.5.22: off unless set true) where it decides a prefill
publish; sglang main (#37958, open) replaces it with the opt-out
``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER`` (the prefill fast path is on unless it is set
true). The activation always calls sglang's own code first, so the installed sglang's switch
is always in force. ``WARCORE_SGLANG_PREFILL_SWITCH`` says whether main's opt-out is read too:
``own`` (the default: only the installed sglang's own switch) or ``main`` (its opt-out as
well; on an sglang that already reads it, that is its own reading). Either variable can only
close the fast path: an operator's "off" always wins. Every place that reads the switches (the
patched prefill decision, its provenance, the trace, the sanitizer) goes through
:func:`read_prefill_switch`, so they cannot disagree.

**The rank check.** ``WARCORE_SGLANG_CHECK_RANKS``: on (``1``, ``true``, ``yes``, ``on``)
checks and refuses a disagreement, ``warn`` checks and serves the disagreeing cells coarse, off
(``0``, unset...) does not check; anything else is an operator's typo, said in the start-up
line, and the check is off. ``WARCORE_SGLANG_CHECK_RANKS_TIMEOUT``: seconds each rank waits for
the others, a plain decimal number above 0 and at most a day; anything else is said in the
start-up line and the core's default applies.

**The meter's control.** ``WARCORE_SGLANG_METER_CONTROL``, a switch spelled as every other:
on, every other batch ``WARCORE_SGLANG_METER`` times is a control (sglang's own code in
warcore's points, :mod:`warcore_sglang.activation._meter`); a value neither on nor off, or on
without the meter, is said in the start-up line and there are no control batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warcore.integration import settings

__all__ = [
    "DEFAULT",
    "ENV_CHECK_RANKS",
    "ENV_METER",
    "ENV_METER_CONTROL",
    "ENV_PREFILL_SWITCH",
    "ENV_TIMEOUT",
    "MAX_TIMEOUT_S",
    "OPT_IN",
    "OPT_OUT",
    "SWITCHES",
    "PrefillSwitch",
    "PrefillSwitchError",
    "check_ranks_mode",
    "fast_path_env",
    "meter_control",
    "prefill_switch_setting",
    "read_prefill_switch",
    "timeout_s",
]

ENV_PREFILL_SWITCH = "WARCORE_SGLANG_PREFILL_SWITCH"
"""Whether the activation also reads sglang main's prefill opt-out: ``own`` (default: the
installed sglang's own switch only) or ``main``; any other value:
:func:`warcore_sglang.install` raises :class:`PrefillSwitchError`."""
OPT_IN = "SGLANG_ENABLE_PREFILL_WAR_READ_DONE"
"""Every audited sglang's switch: the prefill fast path is on while it reads true."""
OPT_OUT = "SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER"
"""sglang main's switch (#37958): the prefill fast path is on unless it reads true."""
DEFAULT = "own"
SWITCHES = {"own": OPT_IN, "main": OPT_OUT}
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
    ``srt.environ.envs``: the installed sglang's own variable is read through it (its default and
    its parsing,
    exactly as sglang's own resolver); the main variable through it where this sglang knows
    it, else from ``environ`` with sglang's boolean parsing (``envs`` may be ``None`` under
    ``main``: sglang's ``environ`` module not imported yet)."""
    if setting == DEFAULT:
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
    otherwise: the opt-in set ``1`` where unset (main's opt-out is off unless set)."""
    return {OPT_IN: environ.get(OPT_IN, "1")}


# -- the rank check ---------------------------------------------------------------------------

ENV_CHECK_RANKS = "WARCORE_SGLANG_CHECK_RANKS"
ENV_TIMEOUT = "WARCORE_SGLANG_CHECK_RANKS_TIMEOUT"
MAX_TIMEOUT_S = 86_400.0
"""A day: past it a rank that never answers holds every other one for good."""


def check_ranks_mode(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(``"raise"``, ``"warn"`` or ``None``: no check; the problem with the value, or
    ``None``)."""
    raw = environ.get(ENV_CHECK_RANKS, "")
    if raw.strip().lower() == "warn":
        return "warn", None
    on, problem = settings.switch(environ, ENV_CHECK_RANKS)
    if problem is not None:
        return None, f"{ENV_CHECK_RANKS}={raw!r} is not 1, warn or 0: rank check off"
    return ("raise" if on else None), None


# -- the meter's control --------------------------------------------------------------------

ENV_METER = "WARCORE_SGLANG_METER"
ENV_METER_CONTROL = "WARCORE_SGLANG_METER_CONTROL"


def meter_control(environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """(whether every other metered batch is a control; the problem with the value, or
    ``None``)."""
    on, problem = settings.switch(environ, ENV_METER_CONTROL)
    if problem is not None:
        return False, f"{problem}: no control batches"
    if on and not environ.get(ENV_METER, "").strip():
        return False, f"{ENV_METER_CONTROL} is on without {ENV_METER}=FILE: no control batches"
    return on, None


def timeout_s(environ: Mapping[str, str]) -> tuple[float | None, str | None]:
    """(seconds, or ``None`` for the core's default; the problem with the value, or
    ``None``)."""
    seconds, problem = settings.seconds(environ, ENV_TIMEOUT, MAX_TIMEOUT_S)
    return seconds, (None if problem is None else f"{problem}: the core's default applies")
