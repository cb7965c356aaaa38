"""A live backend's identity: its warcore name and the context warcore resolves it under.

warcore answers for names (``sglang_dsv4``) and contexts (algorithm, flags), while sglang asks an
instance. This module says which name an instance stands for (the tag sglang's registry builder
left on it, else the nearest class in its MRO that warcore-sglang names), which flags name a
wrapper's children (read off the live wrapper through the wrapper table), and which algorithm
and offload flags apply (the instance's model runner, else this server process's args, read per
call: the runtime context is published after the activation is installed).
"""

from __future__ import annotations

import contextlib
from typing import Any

from warcore import BoundaryContext

from ..declarations import oracle
from ..declarations.names import (
    MAX_DEPTH,
    PREFIX,
    TAG,
    WRAPPERS,
)


def _name_of_class(cls: type) -> str | None:
    """The warcore name of the nearest class in ``cls``'s MRO that warcore-sglang names; None
    when a class it does not name declares for itself first."""
    table = oracle.class_names()
    for klass in cls.__mro__:
        name = table.get(f"{klass.__module__}:{klass.__qualname__}")
        if name is not None:
            return name
        if "shared_read_ends" in vars(klass):
            return None
    return None


def _name_of(backend: Any) -> str | None:
    tag = getattr(backend, "__dict__", {}).get(TAG)
    return tag if isinstance(tag, str) else _name_of_class(type(backend))


def _structure(backend: Any, flags: dict[str, Any], depth: int = 0) -> str | None:
    """``backend``'s warcore name, with the flags naming its children added to ``flags``;
    ``None`` when the tree cannot be said by name (an unknown class, children of a shape the
    flags cannot express)."""
    name = _name_of(backend)
    if name is None or name not in WRAPPERS:
        return name
    if depth > MAX_DEPTH:
        return None
    shape = WRAPPERS[name]
    kids = shape.children_of(backend)
    entries = list(shape.children)
    if len(kids) != len(entries):
        if len(set(entries)) != 1:
            return None
        entries = entries[:1] * len(kids)  # two-batch overlap: every child built alike
    for entry, kid in zip(entries, kids, strict=True):
        kid_name = _structure(kid, flags, depth + 1)
        if kid_name is None:
            return None
        if entry.startswith("="):
            if kid_name != entry[1:]:
                return None
            continue
        value = kid_name[len(PREFIX) :]
        if flags.setdefault(entry, value) != value:
            return None  # two children the one flag would have to name differently
    for flag, attr in shape.switches:
        flags[flag] = bool(getattr(backend, attr))
    return name


def _runner_algorithm(backend: Any, depth: int = 0) -> Any:
    """``model_runner.spec_algorithm`` of ``backend``, or of a child of a wrapper."""
    runner = getattr(backend, "__dict__", {}).get("model_runner")
    algo = getattr(runner, "spec_algorithm", None)
    if algo is not None or depth > MAX_DEPTH:
        return algo
    name = _name_of(backend)
    if name in WRAPPERS:
        with contextlib.suppress(Exception):
            for kid in WRAPPERS[name].children_of(backend):
                algo = _runner_algorithm(kid, depth + 1)
                if algo is not None:
                    return algo
    return None


def process_algorithm(backend: Any = None) -> Any:
    """The speculative algorithm of ``backend``'s runner, else of this server process, else
    none."""
    algo = _runner_algorithm(backend) if backend is not None else None
    if algo is not None:
        return algo
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_spec

        return oracle.api().SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    return oracle.api().SpeculativeAlgorithm.NONE


def offload_flags() -> dict[str, bool]:
    """warcore's offload flags, from sglang's runtime context (the server args' memory bag)."""
    try:
        from sglang.srt.runtime_context import get_memory

        memory = get_memory()
        on = {
            "hicache": bool(memory.enable_hierarchical_cache),
            "hicache_storage": memory.hicache_storage_backend is not None,
            "lmcache": bool(memory.enable_lmcache),
        }
    except Exception:  # not published yet (no server args in this process)
        return {}
    return {k: v for k, v in on.items() if v}


def identify(backend: Any) -> tuple[str | None, BoundaryContext]:
    """``backend``'s warcore name (``None``: warcore-sglang cannot name it) and the context
    warcore resolves it under: this process's algorithm, the flags naming the wrapper's
    children, and the offload flags of the server args."""
    structure: dict[str, Any] = {}
    name = _structure(backend, structure)
    algo = oracle.warcore_algorithm(process_algorithm(backend)) or "none"
    flags = {**(structure if name is not None else {}), **offload_flags()}
    return name, BoundaryContext(algo, flags)
