"""A tiny Llama-style model: RMSNorm, RoPE, GQA attention, SwiGLU MLP, greedy sampling.

Weights are random but seeded, so every run of the same config computes the same tokens. The
default dtype is float64: speculative decoding is lossless only if verify (several query tokens
per request) and decode (one) pick the same argmax, and float64 keeps their rounding
differences far below any logit gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch, LayerAttention

__all__ = ["DraftLlama", "ModelConfig", "TinyLlama"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 256
    sliding_window: int = 24
    swa_layers: tuple[int, ...] = (1, 3)
    max_context: int = 128
    rope_theta: float = 10000.0
    seed: int = 0
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        bad = [i for i in self.swa_layers if not 0 <= i < self.layers]
        if bad:
            raise ValueError(f"swa_layers {bad} out of range for {self.layers} layers")


class _Layer:
    def __init__(self, cfg: ModelConfig, gen: torch.Generator, device: torch.device) -> None:
        def w(*shape: int) -> torch.Tensor:
            weight = torch.randn(*shape, generator=gen, dtype=cfg.dtype) / math.sqrt(shape[0])
            return weight.to(device)

        self.attn_norm = torch.ones(cfg.hidden, dtype=cfg.dtype, device=device)
        self.wq = w(cfg.hidden, cfg.heads * cfg.head_dim)
        self.wk = w(cfg.hidden, cfg.kv_heads * cfg.head_dim)
        self.wv = w(cfg.hidden, cfg.kv_heads * cfg.head_dim)
        self.wo = w(cfg.heads * cfg.head_dim, cfg.hidden)
        self.mlp_norm = torch.ones(cfg.hidden, dtype=cfg.dtype, device=device)
        self.w_gate = w(cfg.hidden, cfg.ffn)
        self.w_up = w(cfg.hidden, cfg.ffn)
        self.w_down = w(cfg.ffn, cfg.hidden)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TinyLlama:
    """The forward is split into ``embed``, ``layer(i)`` and ``sample`` so a runner can launch
    (and a tracer can attribute) each piece on its own."""

    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.cfg = cfg
        gen = torch.Generator().manual_seed(cfg.seed)
        self.embedding = (
            torch.randn(cfg.vocab_size, cfg.hidden, generator=gen, dtype=cfg.dtype)
        ).to(device)
        self.layers = [_Layer(cfg, gen, device) for _ in range(cfg.layers)]
        self.final_norm = torch.ones(cfg.hidden, dtype=cfg.dtype, device=device)
        self.lm_head = (
            torch.randn(cfg.hidden, cfg.vocab_size, generator=gen, dtype=cfg.dtype)
            * cfg.hidden**-0.5
        ).to(device)
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64), inv_freq)
        self.rope_cos = angles.cos().to(cfg.dtype).to(device)
        self.rope_sin = angles.sin().to(cfg.dtype).to(device)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        return self.embedding[batch.input_ids]

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.rope_cos[positions].unsqueeze(-2)
        sin = self.rope_sin[positions].unsqueeze(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def layer(
        self, i: int, h: torch.Tensor, batch: ForwardBatch, backend: LayerAttention
    ) -> torch.Tensor:
        cfg, p = self.cfg, self.layers[i]
        bs, mq = h.shape[0], h.shape[1]
        x = rms_norm(h, p.attn_norm)
        q = (x @ p.wq).view(bs, mq, cfg.heads, cfg.head_dim)
        k = (x @ p.wk).view(bs, mq, cfg.kv_heads, cfg.head_dim)
        v = (x @ p.wv).view(bs, mq, cfg.kv_heads, cfg.head_dim)
        q = self._rope(q, batch.positions)
        k = self._rope(k, batch.positions)
        attn = backend.forward(i, q, k, v, batch)
        h = h + attn.reshape(bs, mq, cfg.heads * cfg.head_dim) @ p.wo
        x = rms_norm(h, p.mlp_norm)
        mlp: torch.Tensor = (torch.nn.functional.silu(x @ p.w_gate) * (x @ p.w_up)) @ p.w_down
        return h + mlp

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = rms_norm(h, self.final_norm) @ self.lm_head
        return logits

    def sample(self, h: torch.Tensor) -> torch.Tensor:
        """Greedy: the argmax token at every query position, ``[bs, max_q]``."""
        return self.logits(h).argmax(dim=-1)


class DraftLlama(TinyLlama):
    """An EAGLE-style drafter: a one-layer model whose input at each position is the token's
    embedding plus a projection of the target's hidden state that predicted that token."""

    def __init__(self, target: ModelConfig, device: torch.device, seed: int = 1) -> None:
        cfg = replace(target, layers=1, swa_layers=(), seed=seed)
        super().__init__(cfg, device)
        gen = torch.Generator().manual_seed(seed + 1000)
        self.feature_proj = (
            torch.randn(cfg.hidden, cfg.hidden, generator=gen, dtype=cfg.dtype) * cfg.hidden**-0.5
        ).to(device)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        features: torch.Tensor = batch.features @ self.feature_proj
        return self.embedding[batch.input_ids] + features
