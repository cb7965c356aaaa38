"""``torch_native``: portable attention over the token-granular KV pool (CPU and CUDA).

It follows the metadata contract: the in-graph init gathers the batch's rows of
``req_to_token`` (and translates them through ``full_to_swa_index_mapping``) into private
buffers; the layers read only those. So its spec declares ``follows_contract=CONTRACT_MODES``
(decode and verify ``IN_REPLAY``). A subclass inherits the code, not the declaration: its own
spec says whether it still follows the contract (``trtllm_mha`` does, ``deepseek_v4`` in decode
only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from warcore.attention._base import AttentionBackend
from warcore.core import BoundaryContext

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch, KVPool

__all__ = ["PagedMetadata", "TorchNativeBackend"]


class PagedMetadata:
    """Private per-forward metadata in static buffers (a captured graph reads fixed addresses)."""

    def __init__(self, pool: KVPool, max_bs: int, capacity: int) -> None:
        dev = pool.req_to_token.device
        ctx = pool.max_context
        self.ctx = ctx
        self.kv_idx = torch.zeros(max_bs * ctx, dtype=torch.int64, device=dev)
        self.kv_idx_swa = torch.zeros(max_bs * ctx, dtype=torch.int64, device=dev)
        self.out_loc_swa = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self.mask = torch.zeros(capacity * ctx, dtype=torch.bool, device=dev)
        self.mask_swa = torch.zeros(capacity * ctx, dtype=torch.bool, device=dev)
        self.key_pos = torch.arange(ctx, device=dev)

    def views(self, bs: int, mq: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        ctx, n = self.ctx, bs * mq
        return (
            self.kv_idx[: bs * ctx].view(bs, ctx),
            self.kv_idx_swa[: bs * ctx].view(bs, ctx),
            self.out_loc_swa[:n].view(bs, mq),
            self.mask[: n * ctx].view(bs, mq, ctx),
            self.mask_swa[: n * ctx].view(bs, mq, ctx),
        )


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def __init__(
        self,
        pool: KVPool,
        max_bs: int,
        capacity: int,
        context: BoundaryContext | None = None,
    ) -> None:
        super().__init__(pool)
        self.meta = PagedMetadata(pool, max_bs, capacity)
        self.window = pool.cfg.sliding_window
        self.context = context if context is not None else BoundaryContext()

    # -- metadata -------------------------------------------------------------------------
    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        """Nothing to prepare eagerly: every shared read happens in the in-graph init."""

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.gather_page_table(batch)
        self.build_masks(batch)

    def gather_page_table(self, batch: ForwardBatch) -> None:
        """Copy the batch's rows of the shared tables into private buffers (the shared reads):
        ``req_to_token`` rows into ``meta.kv_idx``, through ``full_to_swa_index_mapping`` into
        ``meta.kv_idx_swa``, and this forward's SWA write slots into ``meta.out_loc_swa``. Where
        a subclass calls it decides its boundary (in-graph init: ``IN_REPLAY``; out-graph init:
        ``PRE_REPLAY``)."""
        kv_idx, kv_idx_swa, out_loc_swa, _, _ = self.meta.views(batch.batch_size, batch.max_q)
        mapping = self.pool.full_to_swa_index_mapping
        torch.index_select(self.pool.req_to_token, 0, batch.req_pool_indices, out=kv_idx)
        kv_idx_swa.copy_(mapping[kv_idx])
        out_loc_swa.copy_(mapping[batch.out_cache_loc])

    def build_masks(self, batch: ForwardBatch) -> None:
        """Causal masks ``[bs, max_q, max_context]`` over key positions (and the sliding
        window's, for SWA layers) from ``batch.positions`` alone: no shared read, so a subclass
        may call it anywhere (acme builds them in its in-graph init)."""
        _, _, _, mask, mask_swa = self.meta.views(batch.batch_size, batch.max_q)
        pos = batch.positions.unsqueeze(-1)
        key_pos = self.meta.key_pos
        mask.copy_(key_pos <= pos)
        mask_swa.copy_((key_pos <= pos) & (key_pos > pos - self.window))

    # -- compute --------------------------------------------------------------------------
    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch) -> Tensor:
        kv_idx, kv_idx_swa, out_loc_swa, mask, mask_swa = self.meta.views(
            batch.batch_size, batch.max_q
        )
        if layer in self.pool.swa_layers:
            return self.attend(
                layer, q, k, v, self.pool.swa_k, self.pool.swa_v, out_loc_swa, kv_idx_swa, mask_swa
            )
        return self.attend(
            layer, q, k, v, self.pool.k, self.pool.v, batch.out_cache_loc, kv_idx, mask
        )

    @staticmethod
    def attend(
        layer: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_pool: Tensor,
        v_pool: Tensor,
        out_loc: Tensor,
        kv_idx: Tensor,
        mask: Tensor,
    ) -> Tensor:
        """Store the new K/V at ``out_loc``, then attend over the slots in ``kv_idx``."""
        kv_heads, dim = k.shape[-2], k.shape[-1]
        k_cache, v_cache = k_pool[layer], v_pool[layer]
        k_cache[out_loc.reshape(-1)] = k.reshape(-1, kv_heads, dim)
        v_cache[out_loc.reshape(-1)] = v.reshape(-1, kv_heads, dim)
        return paged_attention(q, k_cache[kv_idx], v_cache[kv_idx], mask)


def paged_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """``q`` [bs, mq, H, D]; ``keys``/``values`` [bs, ctx, KVH, D]; ``mask`` [bs, mq, ctx]."""
    heads, kv_heads = q.shape[2], keys.shape[2]
    group = heads // kv_heads
    qh = q.permute(0, 2, 1, 3)  # [bs, H, mq, D]
    kh = keys.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)  # [bs, H, ctx, D]
    vh = values.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vh  # [bs, H, mq, D]
    return out.permute(0, 2, 1, 3)
