"""What the layers below the engine need of a model, as Protocols.

The KV pool and the attention backends read the model's shape; a runner launches the model's
forward in three pieces. :class:`~warcore.engine.TinyLlama` (and its
:class:`~warcore.engine.ModelConfig`) is one such model; saying so here, structurally, keeps
``warcore.runners`` and ``warcore.attention`` from importing the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from warcore.batch._forward import ForwardBatch

__all__ = ["LayerAttention", "Model", "ModelShape"]


class ModelShape(Protocol):
    """The sizes a KV pool, a backend and a runner allocate from (``ModelConfig`` has them)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def sliding_window(self) -> int:
        """Keys a sliding-window layer sees (the query's own position included)."""
        ...

    @property
    def swa_layers(self) -> tuple[int, ...]:
        """The layers that attend through the sliding-window pool."""
        ...

    @property
    def max_context(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...


class LayerAttention(Protocol):
    """What a model's layer calls of its attention backend (every
    :class:`~warcore.attention.AttentionBackend` is one)."""

    def forward(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch
    ) -> Tensor: ...


class Model(Protocol):
    """What a runner needs of a model: its shape, and its forward as ``embed``, one ``layer``
    call per layer, and ``sample`` (so each piece is its own launch, a tracer can attribute
    it, and a probe can act between them)."""

    @property
    def cfg(self) -> ModelShape: ...

    def embed(self, batch: ForwardBatch) -> Tensor:
        """The hidden states ``[bs, max_q, hidden]`` the first layer takes."""
        ...

    def layer(self, i: int, h: Tensor, batch: ForwardBatch, backend: LayerAttention) -> Tensor:
        """Layer ``i`` over ``h``, attending through ``backend``."""
        ...

    def sample(self, h: Tensor) -> Tensor:
        """The next token at every query position, ``[bs, max_q]`` (int64)."""
        ...
