"""The scheduler: admission, continuous batching, KV allocation and the shared-buffer writes.

It decides every batch from what it knows on the host — lengths, and the tokens of the forwards
it has collected — never by waiting for the forward in flight, so the overlap loop and the
serial loop build identical batches. All writes to the shared buffers are device work on the
schedule stream; the engine fences that stream against the forward's reads.

A request is released (its row and slots freed for the very next batch) as soon as the forwards
launched for it are certain to finish it; with speculative decoding a forward may also finish
it early, which the scheduler learns when it collects that forward's tokens.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from warcore.batch import KVPool, StepInput
from warcore.core import ForwardMode
from warcore.device import Device, Stream
from warcore.engine.requests import Request

if TYPE_CHECKING:
    from warcore.engine.hicache import HostKVTier, PrefixMatch

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
        num_draft: int = 0,
        work_s: float = 0.0,
        tier: HostKVTier | None = None,
    ) -> None:
        """``work_s``: extra device work per step on the schedule stream, modelling the
        host-to-device copies of a real scheduler (see :func:`schedule_work`). ``tier``: the
        host KV tier (``hicache``): prefills look their prompts up in it, releases offload to
        it."""
        self.tier = tier
        self.config = config or SchedulerConfig()
        self.pool = pool
        self.device = device
        self.stream = schedule_stream
        self.num_draft = num_draft
        self._extra_work = schedule_work(device, work_s)
        for req in requests:
            need = req.kv_budget(num_draft)
            if need > pool.num_slots - 1 or need > pool.max_context:
                raise ValueError(
                    f"request {req.rid} needs {need} KV positions; the pool has "
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
        if self.tier is not None:
            self.tier.issue(self.stream)  # behind this step's writes, before its launch
        return scheduled

    def _prefill(self) -> Scheduled | None:
        cfg, tier = self.config, self.tier
        admitted: list[Request] = []
        matches: list[PrefixMatch | None] = []
        tokens = 0
        while self.waiting and len(admitted) < cfg.max_prefill_requests:
            req = self.waiting[0]
            match = tier.match(req.prompt) if tier is not None else None
            need = req.kv_budget(self.num_draft) - (match.shared if match is not None else 0)
            fits = (
                len(self.running) + len(admitted) < cfg.max_running
                and self.free_rows
                and tokens + len(req.prompt) <= cfg.max_prefill_tokens
                and self._room(need, match)
            )
            if not fits:
                break
            self.waiting.popleft()
            tokens += len(req.prompt)
            req.row = self.free_rows.pop()
            self.rows_reused += req.row in self._used_rows
            self._used_rows.add(req.row)
            self.reserved += need
            if tier is not None and match is not None:
                tier.admit(req.rid, req.prompt, match)  # its shared blocks are not evicted now
            admitted.append(req)
            matches.append(match)
        if not admitted:
            return None
        writes = _Writes()
        cached = [self._take_cached(r, m, writes) for r, m in zip(admitted, matches, strict=True)]
        for req in admitted:
            self._allocate(req, len(req.prompt), writes)
        self._write(*writes.lists())
        mq = max(len(r.prompt) for r in admitted)
        step = StepInput(
            ForwardMode.EXTEND,
            [r.row for r in admitted],
            [len(r.prompt) for r in admitted],
            mq,
            prompt_ids=[r.prompt + [0] * (mq - len(r.prompt)) for r in admitted],
            cached=cached if tier is not None else None,
        )
        self.running += admitted
        return Scheduled(step, admitted)

    def _room(self, need: int, match: PrefixMatch | None) -> bool:
        """Whether ``need`` more slots can be reserved, evicting unshared cached blocks (not
        ``match``'s) from the device for them."""
        while len(self.free_slots) - self.reserved < need:
            freed = self.tier.evict(match) if self.tier is not None else None
            if freed is None:
                return False
            self._free(*freed)
        return True

    def _take_cached(self, req: Request, match: PrefixMatch | None, writes: _Writes) -> int:
        """Map ``req``'s cached prefix: shared device blocks as they are, host blocks into
        fresh slots their load-back fills. The positions its prefill reads, not writes."""
        if match is None or self.tier is None:
            return 0
        b = match.block
        loads = []
        for i, blk in enumerate(match.blocks):
            if blk.slots is not None:
                slots, swa = blk.slots, blk.swa
            else:
                slots = [self.free_slots.pop() for _ in range(b)]
                swa = [self.free_swa.pop() for _ in range(b)]
                self.reserved -= b
                loads.append((blk, slots, swa))
            for j in range(b):
                req.slots.append(slots[j])
                req.swa_slots.append(swa[j])
                writes.add(req.row, i * b + j, slots[j], swa[j])
        self.tier.load_back(loads)
        return match.positions

    def _decode(self) -> Scheduled | None:
        width = self.num_draft + 1
        # This forward writes positions kv_len .. kv_len + num_draft, where kv_len <= kv_bound.
        # A request whose worst case would leave its reserved budget waits until the host has
        # collected its forward in flight (with one in flight it never has to): writing past
        # the budget would go through row entries that are not its own slots.
        batch = [
            r
            for r in self.running
            if not r.guaranteed and r.kv_bound + width <= r.kv_budget(self.num_draft)
        ]
        if not batch:
            return None
        writes = _Writes()
        for req in batch:
            self._allocate(req, req.kv_bound + width, writes)
        self._write(*writes.lists())
        rows = [r.row for r in batch]
        if self.num_draft:
            step = StepInput(ForwardMode.TARGET_VERIFY, rows, [width] * len(batch), width)
        else:  # without speculation the host knows every committed length exactly
            kv_lens = [r.kv_bound for r in batch]
            step = StepInput(ForwardMode.DECODE, rows, [1] * len(batch), 1, kv_lens=kv_lens)
        return Scheduled(step, batch)

    def _allocate(self, req: Request, positions: int, writes: _Writes) -> None:
        """Give ``req`` slots for its first ``positions`` positions (rows are append-only)."""
        for pos in range(len(req.slots), positions):
            slot, swa = self.free_slots.pop(), self.free_swa.pop()
            self.reserved -= 1
            req.slots.append(slot)
            req.swa_slots.append(swa)
            writes.add(req.row, pos, slot, swa)

    def on_launched(self, scheduled: Scheduled) -> None:
        """Right after the forward is launched: release the requests it is certain to finish,
        so their rows and slots serve the very next batch."""
        width = self.num_draft + 1
        for req in scheduled.requests:
            req.in_flight += 1
            if scheduled.step.forward_mode is ForwardMode.EXTEND:
                req.kv_bound = len(req.prompt)
                if self.tier is not None:
                    self.tier.prefilled[req.rid] = self.tier.newest
            else:
                req.kv_bound += width
            if req.guaranteed:
                self.release(req)

    def on_collected(self, req: Request) -> None:
        """After the host appended a forward's tokens to ``req``."""
        req.in_flight -= 1
        committed = len(req.prompt) + len(req.output) - 1
        req.kv_bound = committed + req.in_flight * (self.num_draft + 1)
        if req.done or req.guaranteed:
            self.release(req)

    def release(self, req: Request) -> None:
        if req not in self.running:
            return
        self.running.remove(req)
        self.reserved -= req.kv_budget(self.num_draft) - len(req.slots)
        self.free_rows.append(req.row)
        slots, swa = req.slots, req.swa_slots
        if self.tier is not None:  # the prefix cache keeps the prompt's blocks
            offload = req.error is None
            slots, swa = self.tier.released(req.rid, req.prompt, slots, swa, offload=offload)
        self._free(slots, swa)

    def _free(self, slots: list[int], swa: list[int]) -> None:
        self.free_slots.extend(reversed(slots))
        self.free_swa.extend(reversed(swa))
        self._mapping_clears += slots

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

        Two separate calls for the mapping: a slot freed and handed out again in the same step
        appears in both, and one ``index_put_`` with duplicate indices has no defined order.
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
            if self._extra_work is not None:
                self.device.launch(self._extra_work, "schedule_copy")


def modelled_wait(seconds: float) -> Callable[[], None]:
    """Stream work that takes ``seconds`` of wall time and no CPU (sim device models)."""

    def wait() -> None:
        time.sleep(seconds)

    return wait


def schedule_work(device: Device, seconds: float) -> Callable[[], None] | None:
    """Device work that takes ``seconds`` on the schedule stream without using the forward's
    compute, like a GPU's host-to-device copy on a copy engine: on sim a sleep (no CPU), on
    CUDA a real pinned copy of ``seconds`` x 25 GB/s bytes."""
    if seconds < 0:
        raise ValueError(f"schedule work must be >= 0 seconds, got {seconds}")
    if seconds == 0:
        return None
    if device.name != "cuda":
        return modelled_wait(seconds)
    nbytes = max(1, int(seconds * COPY_BANDWIDTH_BYTES_PER_S))
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device.torch_device)

    def copy() -> None:
        dst.copy_(src, non_blocking=True)

    return copy


COPY_BANDWIDTH_BYTES_PER_S = 25e9


class _Writes:
    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.slots: list[int] = []
        self.swa: list[int] = []

    def add(self, row: int, col: int, slot: int, swa: int) -> None:
        self.rows.append(row)
        self.cols.append(col)
        self.slots.append(slot)
        self.swa.append(swa)

    def lists(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        return self.rows, self.cols, self.slots, self.slots, self.swa
