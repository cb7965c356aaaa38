"""``flashinfer``: flashinfer's paged decode kernels (optional extra, CUDA only).

Decode maps exactly onto the metadata contract: ``plan()`` is the out-graph init (host-side
scheduling from the step's lengths, plus a device gather of the batch's rows of
``req_to_token`` into the wrapper's fixed index buffer), and ``run()`` only launches kernels on
fixed addresses, so it is recorded into the graph. Its shared reads therefore end before the
replay; it still takes the contract's ``IN_REPLAY`` declaration, which is later and so sound.
Other modes use the portable ``torch_native`` path. flashinfer is imported when the backend is
built, never at ``import warcore``. For the read tracer: every shared read here is a torch op
in the out-graph init (the gather that feeds ``plan()``), which the tracer sees; flashinfer's
own kernels, outside torch's dispatcher, read only the wrapper's private copies, so there is
nothing to declare with :func:`warcore.attention.declare_shared_read`. A kernel that was handed
``req_to_token`` itself would have to declare that read where it is launched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from warcore.attention.torch_native import TorchNativeBackend
from warcore.core import ForwardMode

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch, KVPool

__all__ = ["FlashInferBackend"]

_WORKSPACE_BYTES = 128 * 1024 * 1024
_DTYPES = (torch.float16, torch.bfloat16)


class _Plan:
    """One cuda-graph-mode decode wrapper (fixed batch size) and its fixed buffers."""

    def __init__(self, flashinfer: Any, workspace: Tensor, bs: int, ctx: int) -> None:
        dev = workspace.device
        self.indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
        self.indices = torch.zeros(bs * ctx, dtype=torch.int32, device=dev)
        self.last_page_len = torch.ones(bs, dtype=torch.int32, device=dev)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.indptr,
            paged_kv_indices_buffer=self.indices,
            paged_kv_last_page_len_buffer=self.last_page_len,
        )


class FlashInferBackend(TorchNativeBackend):
    name = "flashinfer"

    def __init__(self, pool: KVPool, *args: Any, **kwargs: Any) -> None:
        """As :class:`TorchNativeBackend`'s; refused off CUDA, or without 16-bit weights."""
        super().__init__(pool, *args, **kwargs)
        if pool.req_to_token.device.type != "cuda":
            raise RuntimeError("the flashinfer backend needs a CUDA device (use --device cuda)")
        if pool.cfg.dtype not in _DTYPES:
            raise ValueError(
                f"the flashinfer backend needs float16 or bfloat16 weights, got {pool.cfg.dtype}"
            )
        import flashinfer

        self._flashinfer = flashinfer
        self._workspace = torch.empty(
            _WORKSPACE_BYTES, dtype=torch.uint8, device=pool.req_to_token.device
        )
        self._plans: dict[tuple[int, bool], _Plan] = {}

    def _plan(self, bs: int, swa: bool) -> _Plan:
        plan = self._plans.get((bs, swa))
        if plan is None:
            plan = _Plan(self._flashinfer, self._workspace, bs, self.pool.max_context)
            self._plans[(bs, swa)] = plan
        return plan

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        if batch.forward_mode is not ForwardMode.DECODE:
            return super().init_forward_metadata_out_graph(batch, in_capture)
        host = None if batch.host is None else batch.host.padded(batch.batch_size)
        if host is None or host.kv_lens is None:
            raise RuntimeError("flashinfer plans decode from host lengths; the step has none")
        cfg, pool, bs = self.pool.cfg, self.pool, batch.batch_size
        lens = [n + 1 for n in host.kv_lens]  # the committed positions plus this token
        ctx = pool.max_context
        rows = host.rows
        flat = [r * ctx + j for r, n in zip(rows, lens, strict=True) for j in range(n)]
        dev = pool.req_to_token.device
        indptr = torch.tensor([0, *_cumsum(lens)], dtype=torch.int32)
        full = pool.req_to_token.view(-1)[torch.tensor(flat, device=dev)]
        mapping = pool.full_to_swa_index_mapping
        _, _, out_loc_swa, _, _ = self.meta.views(bs, batch.max_q)
        out_loc_swa.copy_(mapping[batch.out_cache_loc])
        last = torch.ones(bs, dtype=torch.int32)
        for swa, indices in ((False, full), (True, mapping[full])):
            plan = self._plan(bs, swa)
            plan.wrapper.plan(
                indptr,
                indices.to(torch.int32),
                last,
                cfg.heads,
                cfg.kv_heads,
                cfg.head_dim,
                1,
                window_left=cfg.sliding_window - 1 if swa else -1,
                q_data_type=cfg.dtype,
                kv_data_type=cfg.dtype,
            )

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        if batch.forward_mode is not ForwardMode.DECODE:
            super().init_forward_metadata_in_graph(batch)

    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch) -> Tensor:
        if batch.forward_mode is not ForwardMode.DECODE:
            return super().forward(layer, q, k, v, batch)
        pool, bs = self.pool, batch.batch_size
        swa = layer in pool.swa_layers
        k_pool, v_pool = (pool.swa_k, pool.swa_v) if swa else (pool.k, pool.v)
        _, _, out_loc_swa, _, _ = self.meta.views(bs, batch.max_q)
        loc = (out_loc_swa if swa else batch.out_cache_loc).reshape(-1)
        k_cache, v_cache = k_pool[layer], v_pool[layer]
        k_cache[loc] = k.reshape(-1, *k.shape[2:])
        v_cache[loc] = v.reshape(-1, *v.shape[2:])
        paged = (k_cache.unsqueeze(1), v_cache.unsqueeze(1))  # page size 1, NHD
        out: Tensor = self._plan(bs, swa).wrapper.run(q.reshape(bs, *q.shape[2:]), paged)
        return out.view(bs, 1, *out.shape[1:])


def _cumsum(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out
