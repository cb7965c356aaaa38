"""``acme``: paged attention that snapshots the page table before every replay.

A backend with its own compute, written against :class:`warcore.attention.AttentionBackend`
directly (nothing inherited from ``torch_native``): a template for a backend plugin whose
kernels are its own.

What it reads from the scheduler-shared buffers (``req_to_token`` and the SWA mapping) is
copied into private static buffers in ``init_forward_metadata_out_graph``, which runs eagerly
before a graph replay. The in-graph init only builds masks from positions, and the layers read
only the private copies: the ``PRE_REPLAY`` declaration in every mode.

The contract a backend keeps (see ``AttentionBackend``'s docstrings):

* ``__init__(pool, max_bs, capacity, context)``: the keyword arguments the engine's factory
  call passes (``BackendSpec``); allocate every buffer a captured graph reads here, at its
  largest (``max_bs`` requests, ``capacity`` query tokens, ``pool.max_context`` keys), because a
  graph replays fixed addresses;
* the two metadata halves: static shapes and device ops only (no ``.item()``/``.tolist()``,
  no allocation that changes size per batch), since both may be captured into a graph;
* ``forward(layer, q, k, v, batch)``: store this forward's K/V at ``batch.out_cache_loc`` (the
  slots the runner derived from ``req_to_token``) and attend over the request's context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from warcore.attention import AttentionBackend
from warcore.core import BoundaryContext

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch, KVPool

__all__ = ["AcmeBackend"]


class AcmeBackend(AttentionBackend):
    name = "acme"

    def __init__(
        self,
        pool: KVPool,
        max_bs: int,
        capacity: int,
        context: BoundaryContext | None = None,
    ) -> None:
        super().__init__(pool)
        self.context = context if context is not None else BoundaryContext()
        self.window = pool.cfg.sliding_window
        dev, ctx = pool.req_to_token.device, pool.max_context
        self.ctx = ctx
        # Private copies of the shared tables, sized for the largest batch (static addresses).
        self.kv_idx = torch.zeros(max_bs, ctx, dtype=torch.int64, device=dev)
        self.kv_idx_swa = torch.zeros(max_bs, ctx, dtype=torch.int64, device=dev)
        self.out_loc_swa = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self.mask = torch.zeros(capacity * ctx, dtype=torch.bool, device=dev)
        self.mask_swa = torch.zeros(capacity * ctx, dtype=torch.bool, device=dev)
        self.key_pos = torch.arange(ctx, device=dev)

    # -- metadata -------------------------------------------------------------------------
    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        # Static shapes on static buffers: the private copies are fixed addresses that the
        # captured graph reads on every replay.
        self.gather_page_table(batch)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.build_masks(batch)  # positions only: nothing the scheduler writes

    def gather_page_table(self, batch: ForwardBatch) -> None:
        """The shared reads: the batch's rows of ``req_to_token``, through the SWA mapping."""
        bs = batch.batch_size
        mapping = self.pool.full_to_swa_index_mapping
        torch.index_select(self.pool.req_to_token, 0, batch.req_pool_indices, out=self.kv_idx[:bs])
        self.kv_idx_swa[:bs].copy_(mapping[self.kv_idx[:bs]])
        n = bs * batch.max_q
        self.out_loc_swa[:n].copy_(mapping[batch.out_cache_loc.reshape(-1)])

    def build_masks(self, batch: ForwardBatch) -> None:
        """Causal masks over key positions (and the sliding window's), from positions only."""
        mask, mask_swa = self._masks(batch)
        pos = batch.positions.unsqueeze(-1)
        mask.copy_(self.key_pos <= pos)
        mask_swa.copy_((self.key_pos <= pos) & (self.key_pos > pos - self.window))

    def _masks(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        n = batch.batch_size * batch.max_q * self.ctx
        shape = (batch.batch_size, batch.max_q, self.ctx)
        return self.mask[:n].view(shape), self.mask_swa[:n].view(shape)

    # -- compute --------------------------------------------------------------------------
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        pool, bs = self.pool, batch.batch_size
        mask, mask_swa = self._masks(batch)
        if layer in pool.swa_layers:
            k_pool, v_pool = pool.swa_k[layer], pool.swa_v[layer]
            out_loc = self.out_loc_swa[: bs * batch.max_q]
            kv_idx, mask = self.kv_idx_swa[:bs], mask_swa
        else:
            k_pool, v_pool = pool.k[layer], pool.v[layer]
            out_loc, kv_idx = batch.out_cache_loc.reshape(-1), self.kv_idx[:bs]
        kv_heads, dim = k.shape[-2], k.shape[-1]
        k_pool[out_loc] = k.reshape(-1, kv_heads, dim)
        v_pool[out_loc] = v.reshape(-1, kv_heads, dim)
        return _attend(q, k_pool[kv_idx], v_pool[kv_idx], mask)


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention: ``q`` [bs, mq, H, D]; ``keys``/``values`` [bs, ctx, KVH, D];
    ``mask`` [bs, mq, ctx] (True: attend). Returns [bs, mq, H, D]."""
    group = q.shape[2] // keys.shape[2]
    qh = q.permute(0, 2, 1, 3)
    kh = keys.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    vh = values.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).permute(0, 2, 1, 3)
