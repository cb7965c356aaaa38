"""The dflash block drafter for warcore's reference engine (seeded, tiny, on the target's device).

One non-causal pass drafts a whole block: the context token (the row's next input token plus a
projection of the target hidden state that predicted it) and ``k`` mask tokens attend to each
other without a causal mask, then the target's LM head reads the mask positions. It reads no
scheduler-shared buffer, so it never moves a read-done point. ``dspark`` adds a low-rank
previous-token logit bias (the "Markov head": the target's own embedding read through its LM
head, rank ``hidden``), which makes the block's argmax sequential.

With the reference engine's random weights no cheap drafter predicts the target well, so
acceptance is low; verification is lossless whatever the drafter proposes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from warcore.engine.model import TinyLlama, rms_norm

if TYPE_CHECKING:
    from collections.abc import Sequence

    from warcore.engine.drafter import DraftInput, DraftLocation

__all__ = ["BlockDrafter"]


class BlockDrafter:
    """A :class:`warcore.engine.drafter.Drafter` on the device: it drafts from each row's next
    token and the target hidden state that predicted it (``state.token``, ``state.feature``),
    keeps nothing per request, and queues only torch ops, so the host never waits for it."""

    location: DraftLocation = "device"

    def __init__(
        self,
        target: TinyLlama,
        num_draft: int,
        device: torch.device,
        *,
        markov: bool = False,
        seed: int = 7,
    ) -> None:
        cfg = target.cfg
        hidden = cfg.hidden
        gen = torch.Generator().manual_seed(seed)

        def w(*shape: int, scale: float | None = None) -> torch.Tensor:
            s = shape[0] ** -0.5 if scale is None else scale
            return (torch.randn(*shape, generator=gen, dtype=cfg.dtype) * s).to(device)

        self.num_draft = num_draft
        # DFlash drafters share the target's embedding and LM head.
        self.embedding = target.embedding
        self.lm_head = target.lm_head
        self.mask_embedding = w(num_draft, hidden, scale=0.02)
        self.w_ctx = w(hidden, hidden)
        self.wq, self.wk, self.wv, self.wo = (w(hidden, hidden) for _ in range(4))
        self.w_up, self.w_down = w(hidden, 2 * hidden), w(2 * hidden, hidden)
        # Low-rank bias table: [vocab, hidden] @ [hidden, vocab].
        self.markov_bias = (
            rms_norm(target.embedding, target.final_norm) @ target.lm_head if markov else None
        )

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        """Nothing to keep per request: the block is drafted from the row state alone."""

    def release(self, row: int) -> None:
        pass

    def propose(self, batch: DraftInput) -> None:
        """Write ``num_draft`` proposals for each row into ``state.drafts`` (device work)."""
        rows, state = batch.rows, batch.state
        token = state.token[rows]
        ctx = self.embedding[token] + state.feature[rows] @ self.w_ctx
        bs, k = token.shape[0], self.num_draft
        x = torch.cat((ctx.unsqueeze(1), self.mask_embedding.expand(bs, k, -1)), dim=1)
        q, key, v = x @ self.wq, x @ self.wk, x @ self.wv
        attn = torch.softmax(q @ key.transpose(1, 2) * x.shape[-1] ** -0.5, dim=-1) @ v
        x = x + attn @ self.wo
        x = x + torch.nn.functional.silu(x @ self.w_up) @ self.w_down
        logits = rms_norm(x[:, 1:], torch.ones_like(x[0, 0])) @ self.lm_head  # [bs, k, vocab]
        if self.markov_bias is None:
            drafts = logits.argmax(-1)
        else:
            drafts = torch.empty(bs, k, dtype=torch.int64, device=token.device)
            prev = token
            for j in range(k):
                prev = (logits[:, j] + self.markov_bias[prev]).argmax(-1)
                drafts[:, j] = prev
        batch.write(drafts)
