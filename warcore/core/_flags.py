"""Engine flags: checking names and values against the declared set.

The declared set is the core's :data:`~warcore.core.CORE_FLAGS` plus what plugins declare
through ``warcore_engine_flags`` (collected by the registry, ``Registry.flags``). A flag nobody
declared is an error, never ignored: a declaration or a veto that reads a misspelt flag sees its
default, and that can keep an earlier record point than the engine really allows.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from ._specs import FlagSpec, FlagValue

__all__ = ["check_flags", "parse_decimal"]

_DECIMAL = re.compile(r"-?[0-9]+")


def parse_decimal(text: str) -> int:
    """``text`` as an int if it is plain decimal digits (ASCII ``0-9``, an optional leading
    ``-``), else :class:`ValueError`: ``int()`` also takes ``1_000``, surrounding spaces and
    other scripts' digits, which on a command line are typos. Too many digits for ``int()``
    read as a number too large for any limit, so the caller's range check says so."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(
            f"expected plain decimal digits (0-9, an optional leading -), got {text!r}"
        )
    try:
        return int(text)
    except ValueError:  # more digits than int() converts: past every range anyway
        return -(10**30) if text.startswith("-") else 10**30


def _unknown(name: str, specs: Mapping[str, FlagSpec]) -> str:
    valid = ", ".join(sorted(specs)) or "(none)"
    close = difflib.get_close_matches(name, list(specs), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown engine flag {name!r}{hint}; valid: {valid}"


def _kind(spec: FlagSpec) -> str:
    return spec.kind.__name__


def check_flags(
    flags: Mapping[str, object] | Iterable[tuple[str, object]], specs: Mapping[str, FlagSpec]
) -> dict[str, FlagValue]:
    """The flags of an engine configuration, checked: every name declared, every value of its
    flag's kind (``bool`` exactly for a boolean, an ``int`` that is not a ``bool``, a ``str``).
    Raises :class:`ValueError` naming the first bad flag (and the valid names)."""
    items = flags.items() if isinstance(flags, Mapping) else flags
    out: dict[str, FlagValue] = {}
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise ValueError(f"engine flags: expected (name, value) pairs, got {item!r}") from None
        if not isinstance(name, str):
            raise ValueError(f"engine flags: a flag name must be a str, got {name!r}")
        spec = specs.get(name)
        if spec is None:
            raise ValueError(_unknown(name, specs))
        if type(value) is not spec.kind:
            raise ValueError(
                f"engine flag {name!r} is a {_kind(spec)} flag; got {value!r} "
                f"({type(value).__name__})"
            )
        if spec.bounds is not None and not spec.bounds[0] <= value <= spec.bounds[1]:  # type: ignore[operator]
            least, most = spec.bounds
            raise ValueError(f"engine flag {name!r} must be from {least} to {most}, got {value!r}")
        if name in out and out[name] != value:
            raise ValueError(f"engine flag {name!r} is set twice: {out[name]!r} and {value!r}")
        out[name] = value  # type: ignore[assignment]
    return out
