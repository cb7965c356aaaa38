"""The attention-backend metadata contract (DESIGN §2).

A forward's metadata is built in two halves. ``init_forward_metadata_out_graph`` runs eagerly
before a graph replay and may read scheduler-shared buffers and host data;
``init_forward_metadata_in_graph`` is recorded into the graph (static shapes, no host syncs) and
may read shared buffers too. After the in-graph init a contract-following backend reads only its
private metadata, which is why ``IN_REPLAY`` is the safe default for its decode and verify.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from warcore.engine.kv_pool import KVPool
    from warcore.runners.batch import ForwardBatch

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    """Base class of every attention backend; ``name`` is its stable, plugin-facing identity."""

    name: ClassVar[str]

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def children(self) -> tuple[AttentionBackend, ...]:
        """Backends this one wraps; a wrapper's boundary is the latest of its children's."""
        return ()

    @abstractmethod
    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        """Eager metadata preparation before the replay; may read shared buffers and host data."""

    @abstractmethod
    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        """Static-shape device ops recorded into the graph; the last place shared reads may end
        for a contract-following backend."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager runs: both halves in order."""
        self.init_forward_metadata_out_graph(batch)
        self.init_forward_metadata_in_graph(batch)

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Store this layer's new K/V and return attention output ``[bs, max_q, heads, dim]``.

        ``q``: ``[bs, max_q, heads, dim]``; ``k``/``v``: ``[bs, max_q, kv_heads, dim]``.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
