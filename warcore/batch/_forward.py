"""What one forward reads: the host-side step, the device-side batch, the per-row state.

Tokens are laid out padded, ``[batch_size, max_q]``: request ``i``'s query tokens are
``[i, :q_len]``. Positions and KV slots are derived on the device — positions from the row's
committed length, slots by reading ``req_to_token`` — so a step can be launched before the host
knows how many tokens the previous step accepted. Padding tokens sit at position 0 of the dummy
row and write the dummy slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from warcore.core import ForwardMode

if TYPE_CHECKING:
    from warcore.device import Event

__all__ = ["ForwardBatch", "RowState", "StagedInputs", "StaticBatch", "StepInput"]

Fill = Callable[["ForwardBatch"], None]


@dataclass(frozen=True)
class StepInput:
    """One forward as the scheduler and the speculative worker describe it.

    ``prompt_ids`` (prefill) gives the tokens on the host and starts positions at 0; otherwise
    positions start at the row's committed length plus ``offset`` and ``fill`` (device work)
    writes the input ids, and features where the model takes them, into the batch.
    """

    forward_mode: ForwardMode
    rows: list[int]
    q_lens: list[int]
    max_q: int
    prompt_ids: list[list[int]] | None = None
    offset: int = 0
    fill: Fill | None = None
    kv_lens: list[int] | None = None
    """Committed lengths, where the host knows them exactly (decode without speculation);
    for backends whose out-graph init plans on the host (flashinfer)."""
    request_ids: tuple[int, ...] | None = None
    """The request in each row (real requests only; padding adds none), when the engine says:
    the speculative worker hands them to the algorithm's drafter."""
    cached: list[int] | None = None
    """Prefill with the host KV tier: per request, the leading prompt positions whose KV was
    loaded back into its slots; the target's prefill reads that KV and does not rewrite it."""

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    def padded(self, batch_size: int) -> StepInput:
        """Pad with dummy requests (row 0, no valid tokens) up to a graph bucket's size."""
        extra = batch_size - self.batch_size
        if extra < 0:
            raise ValueError(f"batch of {self.batch_size} does not fit bucket {batch_size}")
        if extra == 0:
            return self
        prompts = None
        if self.prompt_ids is not None:
            prompts = self.prompt_ids + [[0] * self.max_q for _ in range(extra)]
        return replace(
            self,
            rows=self.rows + [0] * extra,
            q_lens=self.q_lens + [0] * extra,
            prompt_ids=prompts,
            kv_lens=None if self.kv_lens is None else self.kv_lens + [0] * extra,
            cached=None if self.cached is None else self.cached + [0] * extra,
        )


@dataclass
class ForwardBatch:
    """The device tensors a forward reads (static views for a captured graph).

    What an attention backend is given: the runner's ``load_batch`` fills the tensors (device
    work on the forward stream) before the backend's out-graph init. In a captured graph they
    are views of fixed buffers sized for the graph's bucket; the tail of the batch is then
    dummy requests (row 0, ``q_lens`` 0). All int64 unless said.
    """

    forward_mode: ForwardMode
    """The mode of this forward (``EXTEND``, ``DECODE``, ``TARGET_VERIFY``, ...)."""
    batch_size: int
    """Requests in the batch (the bucket's size in a graph, padding included)."""
    max_q: int
    """Query tokens per request slot: the longest prompt (prefill), ``num_draft + 1``
    (verify, draft-extend), 1 (decode)."""
    req_pool_indices: torch.Tensor
    """``[bs]``: each request's row in ``req_to_token`` and the row state."""
    q_lens: torch.Tensor
    """``[bs]``: each request's real query tokens (0 for padding)."""
    positions: torch.Tensor
    """``[bs, max_q]``: each query token's position in its request (0 for padding tokens);
    derived on the device from the row's committed length, so a step is launched before the
    host knows how many tokens the previous one accepted."""
    out_cache_loc: torch.Tensor
    """``[bs, max_q]``: the KV slot each query token writes, ``req_to_token[row, position]``
    (read by ``load_batch``; 0, the dummy slot, for padding)."""
    input_ids: torch.Tensor
    """``[bs, max_q]``: the query tokens."""
    features: torch.Tensor
    """``[bs, max_q, hidden]`` (model dtype): input features for models that take them (the
    EAGLE drafter's target hidden states); unused otherwise."""
    host: StepInput | None = None
    """The step on the host, for out-graph inits that plan from host data (flashinfer)."""
    staged: StagedInputs | None = None
    """The persistent host buffers this forward's inputs were staged in (given to the
    out-graph init with ``host``). A backend whose kernels read them after ``load_batch``
    declares until when in ``AttentionBackend.host_reads``: the slot is rewritten after that."""


class StaticBatch:
    """Flat device buffers with room for ``capacity`` tokens; views stay contiguous."""

    def __init__(
        self, device: torch.device, max_bs: int, capacity: int, hidden: int, dtype: torch.dtype
    ) -> None:
        self.max_bs = max_bs
        self.capacity = capacity
        self.rows = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.q_lens = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.features = torch.zeros(capacity, hidden, dtype=dtype, device=device)

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
            self.q_lens[:bs],
            self.positions[:n].view(bs, mq),
            self.out_cache_loc[:n].view(bs, mq),
            self.input_ids[:n].view(bs, mq),
            self.features[:n].view(bs, mq, -1),
        )


class RowState:
    """Per-row state that only the forward stream writes: what the next forward continues from.

    ``kv_len``: positions whose KV is committed (the next input token sits at ``kv_len``);
    ``token``: that next input token; ``feature``: the target's last hidden state (it predicted
    ``token``); ``drafts``: the speculative drafter's proposals for the next verify.
    """

    def __init__(
        self, device: torch.device, rows: int, hidden: int, dtype: torch.dtype, max_draft: int
    ) -> None:
        self.kv_len = torch.zeros(rows, dtype=torch.int64, device=device)
        self.token = torch.zeros(rows, dtype=torch.int64, device=device)
        self.feature = torch.zeros(rows, hidden, dtype=dtype, device=device)
        self.drafts = torch.zeros(rows, max(max_draft, 1), dtype=torch.int64, device=device)


class StagedInputs:
    """One ring slot: the host tensors one forward's ``load_batch`` copies to the device."""

    def __init__(
        self, index: int, rows: torch.Tensor, q_lens: torch.Tensor, prompt: torch.Tensor
    ) -> None:
        self.index = index
        self.rows, self.q_lens, self.prompt = rows, q_lens, prompt
        self.batch_size = 0
        self.max_q = 0
        self.has_prompt = False
        self.release: Event | None = None
        """The host may rewrite this slot once this event is reached (``None``: free)."""

    @classmethod
    def empty(cls, index: int, max_bs: int, capacity: int, pin: bool) -> StagedInputs:
        def buf(n: int) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.int64, pin_memory=pin)

        return cls(index, buf(max_bs), buf(max_bs), buf(capacity))

    def views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``rows [bs]``, ``q_lens [bs]``, ``prompt [bs, max_q]`` (``None`` without prompt)."""
        bs, mq = self.batch_size, self.max_q
        prompt = self.prompt[: bs * mq].view(bs, mq) if self.has_prompt else None
        return self.rows[:bs], self.q_lens[:bs], prompt

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"rows": self.rows, "q_lens": self.q_lens, "prompt": self.prompt}
