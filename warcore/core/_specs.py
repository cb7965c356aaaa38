"""Small typed objects that plugins return and hooks receive."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = [
    "AlgorithmSpec",
    "BackendSpec",
    "BoundaryContext",
    "FlagValue",
    "KNOWN_FAMILIES",
    "NCCL_ALLGATHER_IN_OVERLAP",
    "validate_name",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

KNOWN_FAMILIES = ("none", "eagle", "dflash")
"""Families the reference engine knows how to run (which forwards a step consists of)."""

NCCL_ALLGATHER_IN_OVERLAP = "nccl_allgather_in_overlap"
"""Context flag: an NCCL all-gather syncs the batch inside the overlap loop (trtllm_mha)."""

FlagValue = bool | int | str


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid backend/algorithm name, else raise naming the value."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid {kind} name {name!r}: use lowercase letters, digits and '_', "
            "starting with a letter (at most 64 characters)"
        )
    return name


@dataclass(frozen=True)
class BackendSpec:
    """An attention backend offered by a plugin.

    ``factory(**kwargs)`` builds the backend; it is only called when an engine uses the backend,
    so a plugin's entry-point module can stay light and import the backend class lazily.
    """

    name: str
    factory: Callable[..., AttentionBackend]
    description: str = ""

    def __post_init__(self) -> None:
        validate_name("backend", self.name)
        if not callable(self.factory):
            raise TypeError(f"BackendSpec {self.name!r}: factory must be callable")


@dataclass(frozen=True)
class AlgorithmSpec:
    """A speculative-decoding algorithm offered by a plugin; ``family`` says how it runs.

    ``drafter(target_model, num_draft, device)`` builds the algorithm's drafter for the
    reference engine (lazily, like a backend factory): for the ``dflash`` family an object with
    ``propose(rows, row_state)``, for ``eagle`` a draft model. ``None`` for ``none``.
    """

    name: str
    family: str
    description: str = ""
    drafter: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        validate_name("algorithm", self.name)
        validate_name("algorithm family", self.family)
        if self.drafter is not None and not callable(self.drafter):
            raise TypeError(f"AlgorithmSpec {self.name!r}: drafter must be callable")


class BoundaryContext:
    """What a boundary declaration may depend on besides the backend and the mode.

    ``flags`` holds the engine's configuration switches (for example
    :data:`NCCL_ALLGATHER_IN_OVERLAP`), stored sorted. Contexts are interned: equal contexts
    are one object, so they compare and hash by identity, in C. They key the per-replay
    decision lookup, where a Python-level ``__hash__`` alone cost more than a method call.
    """

    __slots__ = ("algorithm", "flags", "__weakref__")
    _interned: ClassVar[dict[tuple[str, tuple[tuple[str, type, FlagValue], ...]], BoundaryContext]]
    _interned = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    algorithm: str
    flags: tuple[tuple[str, FlagValue], ...]

    def __new__(
        cls,
        algorithm: str = "none",
        flags: Mapping[str, FlagValue] | tuple[tuple[str, FlagValue], ...] = (),
    ) -> BoundaryContext:
        items = sorted(dict(flags).items())
        for key, value in items:
            if not isinstance(key, str) or not isinstance(value, bool | int | str):
                raise TypeError(f"BoundaryContext flag {key!r}={value!r}: need str -> bool/int/str")
        name = validate_name("algorithm", algorithm)
        # The value's type is part of the identity: True and 1 are equal, but not the same flag.
        ident = (name, tuple((k, type(v), v) for k, v in items))
        with cls._lock:
            ctx = cls._interned.get(ident)
            if ctx is None:
                ctx = object.__new__(cls)
                object.__setattr__(ctx, "algorithm", name)
                object.__setattr__(ctx, "flags", tuple(items))
                cls._interned[ident] = ctx
        return ctx

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"BoundaryContext is immutable (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"BoundaryContext(algorithm={self.algorithm!r}, flags={self.flags!r})"

    def __reduce__(
        self,
    ) -> tuple[type[BoundaryContext], tuple[str, tuple[tuple[str, FlagValue], ...]]]:
        return (BoundaryContext, (self.algorithm, self.flags))

    def flag(self, name: str, default: Any = False) -> Any:
        for key, value in self.flags:
            if key == name:
                return value
        return default
