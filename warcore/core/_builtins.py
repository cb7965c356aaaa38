"""The core's own plugin: the ``torch_native`` and ``flashinfer`` backends, ``none`` and ``eagle``.

``torch_native`` follows the metadata contract, so the core default (``IN_REPLAY`` for decode
and verify) is its declaration there. Its EAGLE draft-extend follows the contract too (the
in-graph init gathers the page table; the layers read only that copy), which the contract
default does not cover, so this plugin declares it: ``DRAFT_EXTEND_V2`` → ``IN_REPLAY``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from ._boundary import SharedReadBoundary
from ._hookspecs import hookimpl
from ._modes import ForwardMode
from ._specs import AlgorithmSpec, BackendSpec, BoundaryContext

_PUBLISH_PHASES = {
    "none": frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}),
    "eagle": frozenset({ForwardMode.DRAFT_EXTEND_V2}),
}


def _torch_native(**kwargs: Any) -> Any:
    from warcore.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(**kwargs)


def _flashinfer(**kwargs: Any) -> Any:
    from warcore.attention.flashinfer import FlashInferBackend

    return FlashInferBackend(**kwargs)


def _eagle_drafter(target: Any, num_draft: int, device: Any) -> Any:
    from warcore.engine.model import DraftLlama

    return DraftLlama(target.cfg, device)


@hookimpl
def warcore_attention_backends() -> Iterable[BackendSpec]:
    specs = [BackendSpec("torch_native", _torch_native, "portable torch attention, CPU and CUDA")]
    # find_spec looks for the package without importing it (flashinfer is heavy, CUDA only).
    if importlib.util.find_spec("flashinfer") is not None:
        specs.append(BackendSpec("flashinfer", _flashinfer, "flashinfer paged decode, CUDA only"))
    return specs


@hookimpl
def warcore_speculative_algorithms() -> Iterable[AlgorithmSpec]:
    return [
        AlgorithmSpec("none", "none", "no speculative decoding"),
        AlgorithmSpec(
            "eagle",
            "eagle",
            "autoregressive drafter; draft-extend after verify",
            drafter=_eagle_drafter,
        ),
    ]


@hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    phases = _PUBLISH_PHASES.get(algorithm)
    return None if phases is None else forward_mode in phases


@hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if backend == "torch_native" and forward_mode is ForwardMode.DRAFT_EXTEND_V2:
        return SharedReadBoundary.IN_REPLAY
    return None
