"""Helpers shared by the engine tests: an independent dense oracle, test backends, and a
plugin that declares deepseek_v4's verify boundary as a test chooses."""

from __future__ import annotations

import torch

import warcore
from _support import fresh_manager
from warcore import ForwardMode, SharedReadBoundary
from warcore.attention.torch_native import TorchNativeBackend
from warcore.batch import ForwardBatch
from warcore.core import LoaderConfig, WarcorePluginManager
from warcore.engine.model import TinyLlama, rms_norm


def dense_greedy(model: TinyLlama, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence with plain causal attention: no KV
    pool, no page table, no batching; an oracle independent of the paged path."""
    cfg = model.cfg
    group = cfg.heads // cfg.kv_heads
    tokens = list(prompt)
    out: list[int] = []
    for _ in range(n):
        t = len(tokens)
        pos = torch.arange(t)
        h = model.embedding[torch.tensor(tokens)]
        for i, p in enumerate(model.layers):
            x = rms_norm(h, p.attn_norm)
            q = model._rope((x @ p.wq).view(t, cfg.heads, cfg.head_dim), pos)
            k = model._rope((x @ p.wk).view(t, cfg.kv_heads, cfg.head_dim), pos)
            v = (x @ p.wv).view(t, cfg.kv_heads, cfg.head_dim)
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.einsum("thd,shd->hts", q, k) * cfg.head_dim**-0.5
            allowed = pos[None, :] <= pos[:, None]
            if i in cfg.swa_layers:
                allowed &= pos[None, :] > pos[:, None] - cfg.sliding_window
            scores = scores.masked_fill(~allowed, float("-inf"))
            attn = torch.einsum("hts,shd->thd", torch.softmax(scores, -1), v)
            h = h + attn.reshape(t, -1) @ p.wo
            x = rms_norm(h, p.mlp_norm)
            h = h + (torch.nn.functional.silu(x @ p.w_gate) * (x @ p.w_up)) @ p.w_down
        nxt = int(model.logits(h[-1]).argmax())
        out.append(nxt)
        tokens.append(nxt)
    return out


class LateReaderBackend(TorchNativeBackend):
    """Re-reads the live page table in its last layer: its honest boundary is POST_REPLAY."""

    name = "wctest_late_reader"

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        if layer == self.pool.cfg.layers - 1:
            self.gather_page_table(batch)
        return super().forward(layer, q, k, v, batch)


class LateReaderPlugin:
    """Offers ``wctest_late_reader`` and declares its DECODE boundary as told."""

    def __init__(self, decode_boundary: SharedReadBoundary) -> None:
        self.decode_boundary = decode_boundary

    @warcore.hookimpl
    def warcore_attention_backends(self) -> list[warcore.BackendSpec]:
        return [warcore.BackendSpec("wctest_late_reader", LateReaderBackend, "reads late (test)")]

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == "wctest_late_reader" and forward_mode is ForwardMode.DECODE:
            return self.decode_boundary
        return None


class DeclareDeepseekVerify:
    """Offers the deepseek_v4 backend with a verify boundary of the test's choosing (the
    deepseek_v4 plugin itself is left out of this manager)."""

    def __init__(self, boundary: SharedReadBoundary) -> None:
        self.boundary = boundary

    @warcore.hookimpl
    def warcore_attention_backends(self) -> list[warcore.BackendSpec]:
        from warcore_deepseek_v4.backend import DeepseekV4Backend

        return [warcore.BackendSpec("deepseek_v4", DeepseekV4Backend)]

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend == "deepseek_v4" and forward_mode is ForwardMode.TARGET_VERIFY:
            return self.boundary
        return None


def deepseek_verify_manager(boundary: SharedReadBoundary) -> WarcorePluginManager:
    """The dflash plugin, and deepseek_v4 declared ``boundary`` for its verify."""
    return fresh_manager(
        DeclareDeepseekVerify(boundary), config=LoaderConfig(allowlist=frozenset({"dflash"}))
    )
