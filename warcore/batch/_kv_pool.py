"""The KV pool and the two scheduler-shared buffers the forward reads.

Token-granular paging: ``req_to_token[row, pos]`` is the KV slot of position ``pos`` of the
request in ``row``; sliding-window layers keep their K/V in a separate pool addressed through
``full_to_swa_index_mapping[slot]``. Row 0 and slot 0 are never handed out: padding tokens of a
graph bucket read row 0 and write slot 0, so they can never touch a live request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from warcore.batch._model import ModelShape

__all__ = ["KVPool"]


class KVPool:
    """One model's KV cache and the scheduler-shared tables that address it.

    Tables (int64, on the device; the scheduler writes them on its own stream, the forward
    reads them: the buffers the WAR fence protects, :meth:`shared_buffers`):

    * ``req_to_token[row, pos]`` ``[max_reqs, max_context]``: the KV slot of position ``pos``
      of the request in ``row`` (rows are the requests' places in a batch,
      ``ForwardBatch.req_pool_indices``). Entries past a request's allocated positions are
      stale; row 0 is the padding row.
    * ``full_to_swa_index_mapping[slot]`` ``[num_slots]``: the sliding-window pool's slot for a
      full-attention slot (0 once the slot is freed).

    K/V (this pool's own; a draft model's pool has its own K/V over the target's tables):

    * ``k``, ``v`` ``[layers, num_slots, kv_heads, head_dim]``: full-attention layers;
    * ``swa_k``, ``swa_v``: the same shape, addressed through the mapping, for the layers in
      ``swa_layers`` (window ``cfg.sliding_window``).

    Also: ``cfg`` (the model's :class:`~warcore.batch.ModelShape`, a
    :class:`~warcore.engine.ModelConfig` in the engine), ``max_reqs``,
    ``num_slots``, ``max_context``. Slot 0 and row 0 are never handed out.
    """

    def __init__(
        self,
        cfg: ModelShape,
        device: torch.device,
        *,
        max_reqs: int,
        num_slots: int,
        share_tables_with: KVPool | None = None,
    ) -> None:
        """``share_tables_with``: a draft model's pool has its own K/V but the target's tables
        (same rows, same slots), as in sglang."""
        self.cfg = cfg
        self.max_reqs = max_reqs
        self.num_slots = num_slots
        self.max_context = cfg.max_context
        self.swa_layers = frozenset(cfg.swa_layers)
        self.req_to_token: torch.Tensor
        self.full_to_swa_index_mapping: torch.Tensor
        if share_tables_with is not None:
            self.req_to_token = share_tables_with.req_to_token
            self.full_to_swa_index_mapping = share_tables_with.full_to_swa_index_mapping
        else:
            self.req_to_token = torch.zeros(
                max_reqs, cfg.max_context, dtype=torch.int64, device=device
            )
            self.full_to_swa_index_mapping = torch.zeros(
                num_slots, dtype=torch.int64, device=device
            )
        kv_shape = (cfg.layers, num_slots, cfg.kv_heads, cfg.head_dim)
        self.k = torch.zeros(kv_shape, dtype=cfg.dtype, device=device)
        self.v = torch.zeros(kv_shape, dtype=cfg.dtype, device=device)
        self.swa_k = torch.zeros(kv_shape, dtype=cfg.dtype, device=device)
        self.swa_v = torch.zeros(kv_shape, dtype=cfg.dtype, device=device)

    def shared_buffers(self) -> dict[str, torch.Tensor]:
        """The buffers the scheduler writes while a forward may still read them."""
        return {
            "req_to_token": self.req_to_token,
            "full_to_swa_index_mapping": self.full_to_swa_index_mapping,
        }
