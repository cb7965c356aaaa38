"""Engine flags: checking names and values against the declared set.

The declared set is the core's :data:`~warcore.core.CORE_FLAGS` plus what plugins declare
through ``warcore_engine_flags`` (collected by the registry, ``Registry.flags``). A flag nobody
declared is an error, never ignored: a declaration or a veto that reads a misspelt flag sees its
default, and that can keep an earlier record point than the engine really allows.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ._specs import FlagSpec, FlagValue

__all__ = ["BOOL_FALSE", "BOOL_SPELLINGS", "BOOL_TRUE", "check_flags", "parse_flag_text"]

BOOL_TRUE = ("1", "true", "yes", "on")
BOOL_FALSE = ("0", "false", "no", "off")
BOOL_SPELLINGS = "1/0, true/false, yes/no, on/off"
"""The spellings a boolean flag accepts on the command line (any case); a bare ``NAME`` means
true. The same as the ``WARCORE_*`` boolean variables."""


def _unknown(name: str, specs: Mapping[str, FlagSpec]) -> str:
    valid = ", ".join(sorted(specs)) or "(none)"
    close = difflib.get_close_matches(name, list(specs), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown engine flag {name!r}{hint}; valid: {valid}"


def _kind(spec: FlagSpec) -> str:
    return spec.kind.__name__


def parse_flag_text(text: str, specs: Mapping[str, FlagSpec]) -> tuple[str, FlagValue]:
    """``NAME`` or ``NAME=VALUE`` (the command line's ``--flag``), parsed by the flag's kind.

    A boolean accepts :data:`BOOL_SPELLINGS` (a bare name: true); an integer flag an integer;
    a string flag any text (it needs ``=VALUE``). Raises :class:`ValueError` naming the flag
    (and, for an unknown one, the valid names)."""
    name, sep, raw = text.partition("=")
    if not name:
        raise ValueError(f"--flag {text!r}: expected NAME or NAME=VALUE")
    spec = specs.get(name)
    if spec is None:
        raise ValueError(f"--flag {text!r}: {_unknown(name, specs)}")
    if spec.kind is bool:
        if not sep or raw.lower() in BOOL_TRUE:
            return name, True
        if raw.lower() in BOOL_FALSE:
            return name, False
        raise ValueError(
            f"--flag {text!r}: {name} is a boolean flag; its value must be one of "
            f"{BOOL_SPELLINGS}, got {raw!r}"
        )
    if not sep:
        raise ValueError(f"--flag {text!r}: {name} is a {_kind(spec)} flag and needs a value")
    if spec.kind is int:
        try:
            return name, int(raw)
        except ValueError:
            raise ValueError(f"--flag {text!r}: {name} is an int flag; got {raw!r}") from None
    return name, raw


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
        if name in out and out[name] != value:
            raise ValueError(f"engine flag {name!r} is set twice: {out[name]!r} and {value!r}")
        out[name] = value  # type: ignore[assignment]
    return out
