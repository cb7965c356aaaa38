"""The model runner: one model + one attention backend on the forward stream.

A forward is four phases, whatever executes it: ``load_batch`` (copy the step into static
buffers, then the backend's out-graph init), the in-graph init, the model body, and ``emit``
(feed the sampled tokens forward, copy them to the host). Sub-runners (eager, graph) only
decide *how* the middle two run and *where* the read-done event is recorded, and they take that
decision from the precomputed :class:`~warcore.core.DecisionCache` — never a hook call.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from warcore.core import (
    BoundaryContext,
    DecisionCache,
    ForwardMode,
    RecordPoint,
)
from warcore.device import Device, Event, Stream
from warcore.runners.batch import ForwardBatch, StepInput

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend
    from warcore.engine.kv_pool import KVPool
    from warcore.engine.model import TinyLlama

__all__ = ["ModelRunner", "ReadDoneMailbox", "StepOutput"]


class ReadDoneMailbox:
    """Where a runner leaves the read-done event of its latest forward (sglang's
    ``war_fastpath_read_done_event``); the scheduler's barrier takes and clears it."""

    def __init__(self) -> None:
        self._event: Event | None = None

    def put(self, event: Event | None) -> None:
        self._event = event

    def take(self) -> Event | None:
        event, self._event = self._event, None
        return event

    def peek(self) -> Event | None:
        return self._event


@dataclass
class StepOutput:
    """A launched forward: its sampled tokens arrive in ``tokens`` once ``done`` completes."""

    step: StepInput
    tokens: torch.Tensor
    done: Event
    record_point: RecordPoint

    def result(self) -> list[list[int]]:
        """Block the host until the forward finished; the tokens of the real requests."""
        self.done.synchronize()
        rows: list[list[int]] = self.tokens.tolist()
        return rows


class _Activations:
    """Hidden states handed from one launch of the body to the next."""

    h: torch.Tensor


class ModelRunner:
    """Owns the forward-side state shared by its sub-runners: mailbox, token feed, outputs."""

    def __init__(
        self,
        *,
        device: Device,
        forward_stream: Stream,
        model: TinyLlama,
        pool: KVPool,
        backend: AttentionBackend,
        context: BoundaryContext,
        decisions: DecisionCache,
        max_bs: int,
        capacity: int,
        name: str = "target",
    ) -> None:
        self.device = device
        self.forward_stream = forward_stream
        self.model = model
        self.pool = pool
        self.backend = backend
        self.context = context
        self.decisions = decisions
        self.name = name
        self.max_bs = max_bs
        self.capacity = capacity
        self.mailbox = ReadDoneMailbox()
        tdev = device.torch_device
        self.token_feed = torch.zeros(pool.max_reqs, dtype=torch.int64, device=tdev)
        self.out_tokens = torch.zeros(capacity, dtype=torch.int64, device=tdev)
        self.hidden_out = torch.zeros(capacity, model.cfg.hidden, dtype=model.cfg.dtype, device=tdev)
        self.published: Counter[tuple[ForwardMode, RecordPoint]] = Counter()
        self._act = _Activations()

    # -- the four phases ------------------------------------------------------------------
    def load_batch(self, step: StepInput, fb: ForwardBatch, in_capture: bool = False) -> None:
        """Copy ``step`` into ``fb``'s static buffers, then run the out-graph init."""
        host = _host_tensors(step, pin=self.device.name == "cuda")
        feed = self.token_feed

        def copy() -> None:
            rows, positions, loc, ids, sample = host
            fb.req_pool_indices.copy_(rows, non_blocking=True)
            fb.positions.copy_(positions, non_blocking=True)
            fb.out_cache_loc.copy_(loc, non_blocking=True)
            fb.input_ids.copy_(ids, non_blocking=True)
            fb.sample_index.copy_(sample, non_blocking=True)
            # -1 marks "the token the previous forward sampled for this row".
            fed = feed[fb.req_pool_indices].unsqueeze(1).expand_as(fb.input_ids)
            torch.where(fb.input_ids < 0, fed, fb.input_ids, out=fb.input_ids)

        self.device.launch(copy, "load_batch")
        backend = self.backend
        self.device.launch(
            lambda: backend.init_forward_metadata_out_graph(fb, in_capture), "out_graph_init"
        )

    def in_graph_init(self, fb: ForwardBatch) -> None:
        backend = self.backend
        self.device.launch(lambda: backend.init_forward_metadata_in_graph(fb), "in_graph_init")

    def body(self, fb: ForwardBatch) -> None:
        model, backend, act = self.model, self.backend, self._act
        n = fb.batch_size * fb.max_q
        out = self.out_tokens[:n].view(fb.batch_size, fb.max_q)
        hidden = self.hidden_out[:n].view(fb.batch_size, fb.max_q, -1)

        def embed() -> None:
            act.h = model.embed(fb)

        def layer(i: int) -> None:
            act.h = model.layer(i, act.h, fb, backend)

        def sample() -> None:
            hidden.copy_(act.h)
            out.copy_(model.sample(act.h))

        self.device.launch(embed, "embed")
        for i in range(model.cfg.layers):
            self.device.launch(lambda i=i: layer(i), f"layer{i}")  # type: ignore[misc]
        self.device.launch(sample, "sample")

    def emit(self, step: StepInput, fb: ForwardBatch, point: RecordPoint) -> StepOutput:
        """Feed each request's sampled token to its row and copy the tokens to the host."""
        bs, mq = step.batch_size, fb.max_q
        pin = self.device.name == "cuda"
        tokens = torch.empty((bs, mq), dtype=torch.int64, pin_memory=pin)
        out = self.out_tokens[: fb.batch_size * mq].view(fb.batch_size, mq)
        feed = self.token_feed

        def copy_out() -> None:
            picked = out.gather(1, fb.sample_index.unsqueeze(1)).squeeze(1)
            feed.index_copy_(0, fb.req_pool_indices[:bs], picked[:bs])
            tokens.copy_(out[:bs], non_blocking=True)

        self.device.launch(copy_out, "emit")
        done = self.forward_stream.record_event()
        self.published[(step.forward_mode, point)] += 1
        return StepOutput(step, tokens, done, point)

    def publish_fresh(self) -> None:
        """Record a fresh read-done event on the forward stream, here, now."""
        self.mailbox.put(self.forward_stream.record_event())


def _host_tensors(
    step: StepInput, pin: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def t(data: list[int] | list[list[int]]) -> torch.Tensor:
        tensor = torch.tensor(data, dtype=torch.int64)
        return tensor.pin_memory() if pin else tensor

    return (
        t(step.rows),
        t(step.positions),
        t(step.out_cache_loc),
        t(step.input_ids),
        t(step.sample_index),
    )

