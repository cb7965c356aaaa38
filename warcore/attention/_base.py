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

from warcore.core import SharedReadBoundary

if TYPE_CHECKING:
    import torch

    from warcore.core import BoundaryContext, ForwardMode
    from warcore.engine.kv_pool import KVPool
    from warcore.runners.batch import ForwardBatch

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    """Base class of every attention backend; ``name`` is its stable, plugin-facing identity."""

    name: ClassVar[str]

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool

    def children(self) -> tuple[AttentionBackend, ...]:
        """Backends this one wraps (all of them, whatever the mode)."""
        return ()

    def children_for(
        self, forward_mode: ForwardMode, context: BoundaryContext
    ) -> tuple[AttentionBackend, ...]:
        """The children whose shared reads run in ``forward_mode``: all of them by default (a
        latest-of wrapper); a selecting wrapper returns the one it runs. The wrapper's boundary
        is the latest of these children's and of its own name's declaration, if any."""
        return self.children()

    def refine_prefill_boundary(self, batch: ForwardBatch) -> SharedReadBoundary:
        """Per-batch prefill answer, asked on the host before each prefill whose decision is to
        publish before the replay (static ``PRE_REPLAY`` declaration, no veto).

        Return ``PRE_REPLAY`` to keep that for this batch (and build here whatever snapshot
        makes it true: the out-graph init that follows must leave no shared read in the
        replay), or anything later to withdraw it for this batch (it publishes nothing). It can
        never make a batch earlier than the static declaration. ``batch.host`` is the step.
        Default: keep the static answer.
        """
        return SharedReadBoundary.PRE_REPLAY

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
