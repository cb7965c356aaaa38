"""What one forward reads: the host-side step description and its device-side batch.

Tokens are laid out padded, ``[batch_size, max_q]``: request ``i``'s query tokens are
``[i, :q_len]``; padding tokens sit at position 0 of the dummy row and write the dummy slot.
Decode has ``max_q == 1``, target verify ``max_q == block``, prefill the longest prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from warcore.core import ForwardMode

__all__ = ["ForwardBatch", "StaticBatch", "StepInput"]


@dataclass(frozen=True)
class StepInput:
    """One forward as the scheduler describes it (host lists, already padded to ``max_q``).

    ``input_ids`` rows may hold ``-1`` at column 0, meaning "the token the previous forward
    sampled for this row" (read on the device from the token feed, never via the host).
    """

    forward_mode: ForwardMode
    rows: list[int]
    positions: list[list[int]]
    out_cache_loc: list[list[int]]
    input_ids: list[list[int]]
    sample_index: list[int]
    draft_ids: list[list[int]] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def max_q(self) -> int:
        return len(self.positions[0]) if self.positions else 0

    def padded(self, batch_size: int) -> StepInput:
        """Pad with dummy requests up to a graph bucket's batch size."""
        extra = batch_size - self.batch_size
        if extra < 0:
            raise ValueError(f"batch of {self.batch_size} does not fit bucket {batch_size}")
        if extra == 0:
            return self
        mq = self.max_q
        zeros = [[0] * mq for _ in range(extra)]
        return StepInput(
            self.forward_mode,
            self.rows + [0] * extra,
            self.positions + zeros,
            self.out_cache_loc + zeros,
            self.input_ids + [[0] * mq for _ in range(extra)],
            self.sample_index + [0] * extra,
            self.draft_ids,
        )


@dataclass
class ForwardBatch:
    """The device tensors a forward reads (static views for a captured graph)."""

    forward_mode: ForwardMode
    batch_size: int
    max_q: int
    req_pool_indices: torch.Tensor  # [bs]
    positions: torch.Tensor  # [bs, max_q]
    out_cache_loc: torch.Tensor  # [bs, max_q]
    input_ids: torch.Tensor  # [bs, max_q]
    sample_index: torch.Tensor  # [bs]


class StaticBatch:
    """Flat device buffers with room for ``capacity`` tokens; views stay contiguous."""

    def __init__(self, device: torch.device, max_bs: int, capacity: int) -> None:
        long = dict(dtype=torch.int64, device=device)
        self.max_bs = max_bs
        self.capacity = capacity
        self.rows = torch.zeros(max_bs, **long)  # type: ignore[arg-type]
        self.sample_index = torch.zeros(max_bs, **long)  # type: ignore[arg-type]
        self.positions = torch.zeros(capacity, **long)  # type: ignore[arg-type]
        self.out_cache_loc = torch.zeros(capacity, **long)  # type: ignore[arg-type]
        self.input_ids = torch.zeros(capacity, **long)  # type: ignore[arg-type]

    def view(self, mode: ForwardMode, bs: int, mq: int) -> ForwardBatch:
        if bs > self.max_bs or bs * mq > self.capacity:
            raise ValueError(
                f"batch {bs}x{mq} exceeds static capacity {self.max_bs} requests / "
                f"{self.capacity} tokens"
            )
        n = bs * mq
        return ForwardBatch(
            mode,
            bs,
            mq,
            self.rows[:bs],
            self.positions[:n].view(bs, mq),
            self.out_cache_loc[:n].view(bs, mq),
            self.input_ids[:n].view(bs, mq),
            self.sample_index[:bs],
        )
