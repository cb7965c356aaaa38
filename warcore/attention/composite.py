"""Wrapper backends: the two shapes sglang 0.5.23 composes attention backends in.

* :class:`HybridBackend` (``hybrid``, sglang's ``HybridAttnBackend``) *selects* one child per
  forward mode: the decode child for decode and idle, target-verify on the decode child when
  ``spec_attn_is_decode`` else on the prefill child, every other mode on the prefill child.
  Its shared reads are the selected child's.
* :class:`LayerHybridBackend` (``layer_hybrid``, the shape of sglang's hybrid-linear, two-batch
  overlap and MiniMax wrappers) runs *every* child in every forward (layer ``i`` attends with
  child ``i mod n``), so its reads end at the latest of its children's.

A wrapper's own name may be declared too (sglang's dots-hybrid overrides its child for plain
extend); resolution takes the latest of that and its children's (``children_for``). The
children are built through the registry from engine flags, so any registered backend can be a
child: ``--flag hybrid_prefill_backend=trtllm_mha --flag hybrid_decode_backend=deepseek_v4``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from warcore.attention._base import AttentionBackend
from warcore.core import (
    CORE_FLAGS,
    BoundaryContext,
    FlagValue,
    ForwardMode,
    SharedReadBoundary,
    WarcorePluginManager,
    get_plugin_manager,
    get_registry,
)

if TYPE_CHECKING:
    from torch import Tensor

    from warcore.batch import ForwardBatch

__all__ = [
    "CHILD_FLAGS",
    "HybridBackend",
    "LayerHybridBackend",
    "check_child_flags",
    "check_engine_flags",
    "hybrid_children",
    "layer_hybrid_children",
]


# The core's flags (CORE_FLAGS) that name the wrappers' children.
HYBRID_PREFILL, HYBRID_DECODE = "hybrid_prefill_backend", "hybrid_decode_backend"
SPEC_ATTN_IS_DECODE, LAYER_HYBRID = "spec_attn_is_decode", "layer_hybrid_backends"


def _flag(context: BoundaryContext, name: str) -> Any:
    return context.flag(name, CORE_FLAGS[name].default)


def hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str]:
    """The child ``hybrid`` runs ``mode`` on, by name (sglang's ``_select_backend``)."""
    if mode.is_decode_or_idle():
        return (_flag(context, HYBRID_DECODE),)
    if mode.is_target_verify() and _flag(context, SPEC_ATTN_IS_DECODE):
        return (_flag(context, HYBRID_DECODE),)
    return (_flag(context, HYBRID_PREFILL),)


def layer_hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    names = tuple(n.strip() for n in str(_flag(context, LAYER_HYBRID)).split(",") if n.strip())
    if not names:
        raise ValueError(f"flag {LAYER_HYBRID!r} names no backend")
    return names


CHILD_FLAGS: dict[str, tuple[str, ...]] = {
    "hybrid": (HYBRID_PREFILL, HYBRID_DECODE),
    "layer_hybrid": (LAYER_HYBRID,),
}
"""The flags that name each core wrapper's children."""


def _named(flag: str, value: object) -> tuple[str, ...]:
    if flag == LAYER_HYBRID:
        return tuple(n.strip() for n in str(value).split(",") if n.strip())
    return (str(value),)


def check_child_flags(flags: Mapping[str, FlagValue], backend: Callable[[str], object]) -> None:
    """The children of the core wrappers ``backend`` offers, as ``flags`` name them (the
    defaults for the flags not given): each a usable backend (``backend(name)``,
    ``Registry.backend``, raises for one that is not), and no wrapper among its own children,
    directly
    (``layer_hybrid_backends=layer_hybrid``) or through the other wrapper
    (``hybrid_decode_backend=layer_hybrid`` with ``layer_hybrid_backends=hybrid``). Raises
    :class:`ValueError` naming the flag (and the path back to the wrapper). Called by the
    wrappers before they build a child and by the command line while it parses ``--flag``,
    so ``run``, ``sanitize`` and ``matrix`` refuse the same input with the same line."""

    def children(wrapper: str) -> list[tuple[str, str]]:
        out = []
        for flag in CHILD_FLAGS[wrapper]:
            value = flags.get(flag, CORE_FLAGS[flag].default)
            names = _named(flag, value)
            if not names:
                raise ValueError(f"flag {flag}={value!r} names no backend")
            for name in names:
                try:
                    backend(name)  # unknown, or disabled as a duplicate: the registry says
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"flag {flag}={value!r}: {exc}") from None
                out.append((flag, name))
        return out

    for wrapper in CHILD_FLAGS:
        if not _offered(backend, wrapper):
            continue  # a manager without the core's backends: no wrapper reads these flags
        paths: list[tuple[str, str, tuple[str, ...]]] = [(wrapper, wrapper, (wrapper,))]
        while paths:
            at, text, seen = paths.pop()
            for flag, child in children(at):
                step = f"{text} -{flag}-> {child}"
                if child == wrapper:
                    raise ValueError(f"backend {wrapper!r} cannot be its own child: {step}")
                if child in CHILD_FLAGS and child not in seen:
                    paths.append((child, step, (*seen, child)))


def _offered(backend: Callable[[str], object], name: str) -> bool:
    try:
        backend(name)
    except (KeyError, ValueError):
        return False
    return True


def check_engine_flags(
    flags: Mapping[str, object], pm: WarcorePluginManager
) -> dict[str, FlagValue]:
    """``flags`` checked as ``--flag`` checks them, for the Python API's entry points
    (``build_matrix``, ``model_differences``) and the command line alike: each declared and of
    its flag's kind (``Registry.check_flags``), and the wrappers' children usable
    (:func:`check_child_flags`), against ``pm``'s registry. Raises :class:`ValueError` naming
    the flag."""
    registry = get_registry(pm)
    checked = registry.check_flags(dict(flags))
    check_child_flags(checked, registry.backend)
    return checked


def _build(
    wrapper: str,
    names: Sequence[str],
    pool: Any,
    max_bs: int,
    capacity: int,
    context: BoundaryContext,
) -> list[AttentionBackend]:
    """The children ``names`` of ``wrapper``, each built by its registered factory with the
    wrapper's own constructor arguments."""
    registry = get_registry(get_plugin_manager())
    check_child_flags(dict(context.flags), registry.backend)
    children = []
    for name in names:
        factory = registry.backend(name).factory
        child = factory(pool=pool, max_bs=max_bs, capacity=capacity, context=context)
        if not isinstance(child, AttentionBackend):
            raise TypeError(f"{wrapper!r}: child {name!r} built {child!r}, not an AttentionBackend")
        children.append(child)
    return children


class HybridBackend(AttentionBackend):
    """Selects one child per forward mode; every call goes to the selected child."""

    name = "hybrid"

    def __init__(self, pool: Any, max_bs: int, capacity: int, context: BoundaryContext) -> None:
        super().__init__(pool)
        self.context = context
        names = [_flag(context, HYBRID_PREFILL), _flag(context, HYBRID_DECODE)]
        children = _build(self.name, names, pool, max_bs, capacity, context)
        self.prefill_backend, self.decode_backend = children
        self.spec_attn_is_decode = bool(_flag(context, SPEC_ATTN_IS_DECODE))

    def select(self, mode: ForwardMode) -> AttentionBackend:
        if mode.is_decode_or_idle():
            return self.decode_backend
        if mode.is_target_verify() and self.spec_attn_is_decode:
            return self.decode_backend
        return self.prefill_backend

    def children(self) -> tuple[AttentionBackend, ...]:
        return (self.prefill_backend, self.decode_backend)

    def children_for(
        self, forward_mode: ForwardMode, context: BoundaryContext
    ) -> tuple[AttentionBackend, ...]:
        return (self.select(forward_mode),)

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        self.select(batch.forward_mode).init_forward_metadata_out_graph(batch, in_capture)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.select(batch.forward_mode).init_forward_metadata_in_graph(batch)

    def refine_prefill_boundary(self, batch: ForwardBatch) -> SharedReadBoundary:
        return self.select(batch.forward_mode).refine_prefill_boundary(batch)

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch) -> Tensor:
        return self.select(batch.forward_mode).forward(layer, q, k, v, batch)


class LayerHybridBackend(AttentionBackend):
    """Every child prepares its metadata in every forward; layer ``i`` uses child ``i mod n``."""

    name = "layer_hybrid"

    def __init__(self, pool: Any, max_bs: int, capacity: int, context: BoundaryContext) -> None:
        super().__init__(pool)
        self.context = context
        names = layer_hybrid_children(ForwardMode.DECODE, context)
        self._children = tuple(_build(self.name, names, pool, max_bs, capacity, context))

    def children(self) -> tuple[AttentionBackend, ...]:
        return self._children

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        for child in self._children:
            child.init_forward_metadata_out_graph(batch, in_capture)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        for child in self._children:
            child.init_forward_metadata_in_graph(batch)

    def refine_prefill_boundary(self, batch: ForwardBatch) -> SharedReadBoundary:
        # Every child's reads run: the batch keeps PRE_REPLAY only if every child keeps it.
        answers = [c.refine_prefill_boundary(batch) for c in self._children]
        return max(answers, key=lambda b: b.value)

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch) -> Tensor:
        return self._children[layer % len(self._children)].forward(layer, q, k, v, batch)
