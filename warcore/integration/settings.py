"""An integration's settings, read from the environment, and its start-up line.

Every switch an integration reads (``WARCORE_SGLANG``, ``WARCORE_VLLM``, the sanitizer's
``WARCORE_SGLANG_SANITIZE``...) is spelled one way: on is ``1``, ``true``, ``yes`` or ``on``, off
is unset, empty, ``0``, ``false``, ``no`` or ``off`` (any case, spaces around ignored); anything
else is an operator's typo, said in the start-up line, and the switch stays off. A number of
seconds is a plain decimal number in a range. Standard library only.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping

__all__ = ["FALSE", "TRUE", "emit", "seconds", "switch"]

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"", "0", "false", "no", "off"})
_PLAIN = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def switch(environ: Mapping[str, str], name: str) -> tuple[bool, str | None]:
    """(whether ``name`` is on; the problem with its value, or ``None``). A value neither on
    nor off is off, and its problem names it."""
    raw = environ.get(name, "")
    flag = raw.strip().lower()
    if flag in TRUE:
        return True, None
    if flag in FALSE:
        return False, None
    return False, f"{name}={raw!r} is neither on (1, true, yes, on) nor off (0, false, no, off)"


def seconds(
    environ: Mapping[str, str], name: str, maximum: float
) -> tuple[float | None, str | None]:
    """(``name``'s seconds, or ``None`` when unset or bad; the problem with its value, or
    ``None``): a plain decimal number above 0 and at most ``maximum``."""
    raw = environ.get(name, "")
    text = raw.strip()
    if not text:
        return None, None
    if _PLAIN.fullmatch(text) and 0 < float(text) <= maximum:
        return float(text), None
    return (
        None,
        f"{name}={raw!r} is not a plain number of seconds above 0 and at most {maximum:,.0f}",
    )


def emit(logger: logging.Logger, level: int, line: str) -> None:
    """Log ``line`` where logging would show it; otherwise on stderr directly (an engine loads
    its plugins before it configures logging, or configures only its own logger): the start-up
    line is never lost."""
    if logger.isEnabledFor(level) and (logging.getLogger().handlers or logger.handlers):
        logger.log(level, line)
    else:
        print(f"[{logging.getLevelName(level)}] {line}", file=sys.stderr, flush=True)
