"""The attention backends the core's own plugin (``warcore``) offers, and their declarations:
``torch_native``, the wrappers ``hybrid`` and ``layer_hybrid``, and ``flashinfer``.

``torch_native`` follows the metadata contract (its in-graph init gathers the batch's rows of
the page table into private buffers, and its layers read only those), and its spec says so:
``follows_contract=CONTRACT_MODES``, so a captured decode and verify are ``IN_REPLAY``
(provenance ``contract:warcore``). So does ``flashinfer``'s (its ``plan()`` reads the page
table before the replay, ``run()`` only the wrapper's copy; its other modes are
``torch_native``'s). ``torch_native``'s EAGLE draft-extend follows the same rule, which the
contract does not cover, so this plugin declares it: ``DRAFT_EXTEND_V2`` → ``IN_REPLAY``. Its
eager path runs the same two halves as its graph (the runner calls them in order; it has no
separate eager body), so its eager decode, verify and draft-extend are declared ``IN_REPLAY``
too. These are warcore's own audits of its reference backend, shown by ``warcore sanitize``;
sglang 0.5.23 declares ``UNKNOWN`` for draft-extend and publishes nothing for eager forwards.

Registered as part of :mod:`warcore.engine.builtin_plugin`. Imports no backend class (nor
torch) until a backend is built.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from warcore.core import (
    CONTRACT_MODES,
    BackendSpec,
    BoundaryContext,
    ForwardMode,
    SharedReadBoundary,
    hookimpl,
)

__all__ = ["warcore_attention_backends", "warcore_shared_read_boundary"]

_TORCH_NATIVE_EAGER = frozenset(
    {ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2}
)


def _torch_native(**kwargs: Any) -> Any:
    from warcore.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(**kwargs)


def _hybrid(**kwargs: Any) -> Any:
    from warcore.attention.composite import HybridBackend

    return HybridBackend(**kwargs)


def _layer_hybrid(**kwargs: Any) -> Any:
    from warcore.attention.composite import LayerHybridBackend

    return LayerHybridBackend(**kwargs)


def _hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    from warcore.attention.composite import hybrid_children

    return hybrid_children(mode, context)


def _layer_hybrid_children(mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    from warcore.attention.composite import layer_hybrid_children

    return layer_hybrid_children(mode, context)


def _flashinfer(**kwargs: Any) -> Any:
    from warcore.attention.flashinfer import FlashInferBackend

    return FlashInferBackend(**kwargs)


@hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    specs = [
        BackendSpec(
            "torch_native",
            _torch_native,
            "portable torch attention, CPU and CUDA",
            follows_contract=CONTRACT_MODES,  # warcore's audit: warcore sanitize --all
        ),
        BackendSpec(
            "hybrid",
            _hybrid,
            "selects a child per mode: prefill / decode children (flags hybrid_*_backend)",
            children_for=_hybrid_children,
        ),
        BackendSpec(
            "layer_hybrid",
            _layer_hybrid,
            "layer i attends with child i mod n; reads end at the latest child's",
            children_for=_layer_hybrid_children,
        ),
    ]
    # find_spec looks for the package without importing it (flashinfer is heavy, CUDA only).
    if importlib.util.find_spec("flashinfer") is not None:
        specs.append(
            BackendSpec(
                "flashinfer",
                _flashinfer,
                "flashinfer paged decode, CUDA only",
                follows_contract=CONTRACT_MODES,  # plan() gathers before the replay
            )
        )
    return specs


@hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
) -> SharedReadBoundary | None:
    if backend != "torch_native":
        return None
    if forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        return SharedReadBoundary.IN_REPLAY
    if eager and forward_mode in _TORCH_NATIVE_EAGER:
        return SharedReadBoundary.IN_REPLAY
    return None  # a captured decode and verify: the contract its spec declares
