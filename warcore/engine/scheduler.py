"""The scheduler: admission, continuous batching, KV allocation and the shared-buffer writes.

It decides every batch from request lengths alone (never from sampled tokens), so the overlap
loop and the serial loop build identical batches. All writes to the shared buffers are device
work on the schedule stream; the engine fences that stream against the forward's reads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from warcore.core import ForwardMode
from warcore.device import Device, Stream
from warcore.engine.kv_pool import KVPool
from warcore.engine.requests import Request
from warcore.runners.batch import StepInput

__all__ = ["Scheduled", "Scheduler", "SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 16
    max_prefill_requests: int = 8
    max_prefill_tokens: int = 256


@dataclass
class Scheduled:
    """A batch handed to the forward, with the requests whose tokens it samples."""

    step: StepInput
    requests: list[Request]


class Scheduler:
    def __init__(
        self,
        requests: list[Request],
        pool: KVPool,
        device: Device,
        schedule_stream: Stream,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        self.pool = pool
        self.device = device
        self.stream = schedule_stream
        for req in requests:
            if req.kv_needed > pool.num_slots - 1 or req.kv_needed > pool.max_context:
                raise ValueError(
                    f"request {req.rid} needs {req.kv_needed} KV positions; the pool has "
                    f"{pool.num_slots - 1} slots and a context of {pool.max_context}"
                )
        self.future = deque(sorted(requests, key=lambda r: (r.arrival_step, r.rid)))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Stacks: a freed row or slot is the next one handed out, so reuse is immediate.
        self.free_rows = list(range(pool.max_reqs - 1, 0, -1))
        self.free_slots = list(range(pool.num_slots - 1, 0, -1))
        self.free_swa = list(range(1, pool.num_slots))
        self.reserved = 0
        self.rows_reused = 0
        """Admissions into a row that an earlier request had used (the WAR-race setting)."""
        self._used_rows: set[int] = set()
        self._mapping_clears: list[int] = []

    # -- queries --------------------------------------------------------------------------
    @property
    def finished_scheduling(self) -> bool:
        return not (self.future or self.waiting or self.running)

    def next_arrival(self) -> int | None:
        return self.future[0].arrival_step if self.future else None

    # -- batches --------------------------------------------------------------------------
    def schedule(self, step_index: int) -> Scheduled | None:
        """The next batch (prefill first), with its shared-buffer writes launched on the
        schedule stream; ``None`` when nothing can run at this step."""
        while self.future and self.future[0].arrival_step <= step_index:
            self.waiting.append(self.future.popleft())
        scheduled = self._prefill() or self._decode()
        if scheduled is None and self._mapping_clears:
            self._write([], [], [], [], [])
        return scheduled

    def _prefill(self) -> Scheduled | None:
        cfg = self.config
        admitted: list[Request] = []
        tokens = 0
        while self.waiting and len(admitted) < cfg.max_prefill_requests:
            req = self.waiting[0]
            fits = (
                len(self.running) + len(admitted) < cfg.max_running
                and self.free_rows
                and len(self.free_slots) - self.reserved >= req.kv_needed
                and tokens + len(req.prompt) <= cfg.max_prefill_tokens
            )
            if not fits:
                break
            self.waiting.popleft()
            tokens += len(req.prompt)
            req.row = self.free_rows.pop()
            self.rows_reused += req.row in self._used_rows
            self._used_rows.add(req.row)
            n = len(req.prompt)
            req.slots = [self.free_slots.pop() for _ in range(n)]
            req.swa_slots = [self.free_swa.pop() for _ in range(n)]
            self.reserved += req.kv_needed - n
            admitted.append(req)
        if not admitted:
            return None
        mq = max(len(r.prompt) for r in admitted)
        rows, cols, vals, map_idx, map_val = [], [], [], [], []
        for req in admitted:
            n = len(req.prompt)
            rows += [req.row] * n
            cols += list(range(n))
            vals += req.slots
            map_idx += req.slots
            map_val += req.swa_slots
        self._write(rows, cols, vals, map_idx, map_val)
        step = StepInput(
            ForwardMode.EXTEND,
            [r.row for r in admitted],
            [_pad(list(range(len(r.prompt))), mq) for r in admitted],
            [_pad(r.slots, mq) for r in admitted],
            [_pad(r.prompt, mq) for r in admitted],
            [len(r.prompt) - 1 for r in admitted],
        )
        self.running += admitted
        return Scheduled(step, admitted)

    def _decode(self) -> Scheduled | None:
        batch = [r for r in self.running if r.launched < r.max_new_tokens]
        if not batch:
            return None
        rows, cols, vals, map_idx, map_val = [], [], [], [], []
        positions = []
        for req in batch:
            pos = len(req.prompt) + req.launched - 1
            slot, swa = self.free_slots.pop(), self.free_swa.pop()
            self.reserved -= 1
            req.slots.append(slot)
            req.swa_slots.append(swa)
            rows.append(req.row)
            cols.append(pos)
            vals.append(slot)
            map_idx.append(slot)
            map_val.append(swa)
            positions.append(pos)
        self._write(rows, cols, vals, map_idx, map_val)
        step = StepInput(
            ForwardMode.DECODE,
            [r.row for r in batch],
            [[p] for p in positions],
            [[r.slots[-1]] for r in batch],
            [[-1] for _ in batch],
            [0] * len(batch),
        )
        return Scheduled(step, batch)

    def on_launched(self, scheduled: Scheduled) -> None:
        """Right after the forward is launched: requests whose last token it samples are done
        from the scheduler's point of view; their row and slots are free for the next batch."""
        for req in scheduled.requests:
            req.launched += 1
            if req.launched >= req.max_new_tokens:
                self.release(req)

    def release(self, req: Request) -> None:
        if req not in self.running:
            return
        self.running.remove(req)
        self.reserved -= req.kv_needed - len(req.slots)
        self.free_rows.append(req.row)
        self.free_slots.extend(reversed(req.slots))
        self.free_swa.extend(reversed(req.swa_slots))
        self._mapping_clears += req.slots

    # -- device writes --------------------------------------------------------------------
    def _write(
        self,
        rows: list[int],
        cols: list[int],
        vals: list[int],
        map_idx: list[int],
        map_val: list[int],
    ) -> None:
        """One launch on the schedule stream: clear freed mappings, then write the new entries.

        Two separate ``index_put_`` calls for the mapping: a slot freed and handed out again in
        the same step appears in both, and one call with duplicate indices has no defined order.
        """
        clears, self._mapping_clears = self._mapping_clears, []
        dev = self.device.torch_device
        pin = self.device.name == "cuda"

        def t(data: list[int]) -> torch.Tensor:
            tensor = torch.tensor(data, dtype=torch.int64)
            return tensor.pin_memory() if pin else tensor

        r, c, v, mi, mv, cl = t(rows), t(cols), t(vals), t(map_idx), t(map_val), t(clears)
        req_to_token = self.pool.req_to_token
        mapping = self.pool.full_to_swa_index_mapping

        def write() -> None:
            mapping.index_fill_(0, cl.to(dev, non_blocking=True), 0)
            req_to_token.index_put_(
                (r.to(dev, non_blocking=True), c.to(dev, non_blocking=True)),
                v.to(dev, non_blocking=True),
            )
            mapping.index_put_((mi.to(dev, non_blocking=True),), mv.to(dev, non_blocking=True))

        with self.device.use_stream(self.stream):
            self.device.launch(write, "schedule_write")


def _pad(values: list[int], length: int) -> list[int]:
    return values + [0] * (length - len(values))
