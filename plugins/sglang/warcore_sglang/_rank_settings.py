"""The rank check's two settings, read from the environment (standard library only: the entry
point says a bad value in its start-up line before anything of warcore is imported).

``WARCORE_SGLANG_CHECK_RANKS``: ``1`` (``true``, ``yes``, ``on``) checks and refuses a
disagreement, ``warn`` checks and serves the disagreeing cells coarse, ``0`` (``false``,
``no``, ``off``, unset) does not check; anything else is an operator's typo, said in the
start-up line, and the check is off (as when unset). ``WARCORE_SGLANG_CHECK_RANKS_TIMEOUT``:
seconds each rank waits for the others, a plain decimal number above 0 and at most a day;
anything else is said in the start-up line and the core's default applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["ENV_CHECK_RANKS", "ENV_TIMEOUT", "MAX_TIMEOUT_S", "check_ranks_mode", "timeout_s"]

ENV_CHECK_RANKS = "WARCORE_SGLANG_CHECK_RANKS"
ENV_TIMEOUT = "WARCORE_SGLANG_CHECK_RANKS_TIMEOUT"
MAX_TIMEOUT_S = 86_400.0
"""A day: past it a rank that never answers holds every other one for good."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
_PLAIN = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def check_ranks_mode(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(``"raise"``, ``"warn"`` or ``None``: no check; the problem with the value, or
    ``None``)."""
    raw = environ.get(ENV_CHECK_RANKS, "")
    flag = raw.strip().lower()
    if flag == "warn":
        return "warn", None
    if flag in _TRUE:
        return "raise", None
    if flag in _FALSE:
        return None, None
    return None, f"{ENV_CHECK_RANKS}={raw!r} is not 1, warn or 0: rank check off"


def timeout_s(environ: Mapping[str, str]) -> tuple[float | None, str | None]:
    """(seconds, or ``None`` for the core's default; the problem with the value, or
    ``None``)."""
    raw = environ.get(ENV_TIMEOUT, "")
    text = raw.strip()
    if not text:
        return None, None
    if _PLAIN.fullmatch(text) and 0 < float(text) <= MAX_TIMEOUT_S:
        return float(text), None
    return None, (
        f"{ENV_TIMEOUT}={raw!r} is not a plain number of seconds above 0 and at most "
        f"{MAX_TIMEOUT_S:,.0f}: the core's default applies"
    )
