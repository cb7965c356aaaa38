"""The prefix cache behind the ``hicache`` engine flag: finished prompts' KV kept on the device
by prefix, written through to a host tier, evicted from the device under pressure and loaded
back from host memory on a copy stream.

What it models (sglang's hierarchical radix cache, write-through), in blocks of ``block``
prompt tokens keyed by the prompt's block-aligned prefix:

* **device tier**: when a request is released, its prompt blocks stay on the device (their
  slots do not go back to the pool) and a later request whose prompt starts with them shares
  the slots (reference counted), its prefill attending over them without writing them. When the
  scheduler needs slots, it evicts unreferenced blocks, least recently used first: their slots
  go back to the pool;
* **host tier**: each block kept on the device is copied to host memory at once (write-through),
  so a device eviction copies nothing; a later hit on a block only the host still holds loads
  it back into the request's freshly allocated slots before its prefill. Host blocks are evicted
  least recently used first too.

Both copies run on the tier's own ``hicache`` stream, ordered behind the schedule stream only,
as in sglang:

* the offload reads the released request's prompt slots: when that request's prefill is the
  forward in flight, only the whole-forward barrier after the prefill (the built-in veto of the
  prefill fast path when ``hicache`` is on) makes the schedule stream, and so the copy, wait
  until the prefill has written them;
* the load-back writes slots the scheduler just handed out, which may have been freed (by a
  finished request or a device eviction) while a forward that reads them is still in flight
  (the slot pool is a stack: a freed slot is the next one handed out). Each freed slot is
  tagged with the newest launched step; the load-back first makes its stream wait on that
  step's *done event* (recorded on the forward stream after the step's last forward): a device
  wait, never a host sync. vLLM's rule (#45357) in device time; sglang #36738 fenced the
  load-back behind the whole forward stream.

The forward stream waits on the tier's stream before every launch (it reads what the load-back
wrote, and its writes must follow the offload's reads of the slots it reuses). Shared slots
need no copy and no wait: every forward runs on one stream.

Rows of ``req_to_token`` are not part of this: they stay immediately reusable, since their
rewrite is what the read-done fence protects.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from warcore.batch import KVPool
from warcore.device import Device, Event, Stream

__all__ = [
    "CachedBlock",
    "HostKVTier",
    "PrefixCacheStats",
    "PrefixMatch",
    "copy_order_problem",
    "slot_ready_step",
]


@dataclass
class PrefixCacheStats:
    """What the prefix cache did in one run (``RunReport.prefix_cache``)."""

    lookups: int = 0
    """Admitted prefills whose prompt was looked up."""
    hits: int = 0
    """Lookups that found a cached prefix (at least one block)."""
    tokens_looked_up: int = 0
    """Prompt tokens of the lookups (each prompt's last token is never cached)."""
    tokens_shared: int = 0
    """Prompt tokens whose KV a prefill shared with the device tier (no copy)."""
    tokens_loaded: int = 0
    """Prompt tokens whose KV was loaded back from host memory."""
    tokens_offloaded: int = 0
    """Prompt tokens whose KV was copied to host memory."""
    device_evictions: int = 0
    """Device blocks evicted to make room in the KV pool (their slots freed)."""
    evictions: int = 0
    """Host blocks dropped to make room in host memory."""
    done_waits: int = 0
    """Load-backs whose stream waited on a step's done event (slots freed by a forward that
    may still have been running)."""
    copies_checked: int = 0
    """Copies the order check judged (every offload and load-back)."""
    unordered: list[str] = field(default_factory=list)
    """Copies not ordered behind the last forward that touches their slots (the order
    check's findings, :func:`copy_order_problem`; empty when the tier is sound)."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def token_hit_rate(self) -> float:
        cached = self.tokens_shared + self.tokens_loaded
        return cached / self.tokens_looked_up if self.tokens_looked_up else 0.0

    def format(self) -> str:
        cached = self.tokens_shared + self.tokens_loaded
        return (
            f"{self.hits}/{self.lookups} prefills hit ({self.hit_rate:.0%}), "
            f"{cached}/{self.tokens_looked_up} prompt tokens cached ({self.token_hit_rate:.0%}: "
            f"{self.tokens_shared} shared on device, {self.tokens_loaded} loaded back), "
            f"{self.tokens_offloaded} offloaded, {self.device_evictions} device and "
            f"{self.evictions} host blocks evicted, {self.done_waits} load-backs behind a "
            f"done event"
        )


def slot_ready_step(freed_at: list[int], slots: list[int]) -> int:
    """The newest step that may still touch any of ``slots`` (0: none): each slot's tag is the
    newest step launched when it was freed. A writer off the forward stream waits on that
    step's done event before writing them."""
    return max((freed_at[s] for s in slots), default=0)


def copy_order_problem(kind: str, toucher: int, behind: int) -> str | None:
    """Why a tier copy races (``None``: it does not): ``toucher`` is the newest step whose
    forward touches the copy's device slots in the way that conflicts with the copy (for an
    offload, the prefill that wrote them; for a load-back, any forward that may still read or
    write them), ``behind`` the newest step whose *whole* forward the copy's stream is ordered
    after (through a whole-forward barrier, a done event, or a host sync). Steps are numbered
    in launch order on one forward stream, so ordering behind a step orders behind all before
    it. Host bookkeeping only: the verdict does not depend on how the streams interleave."""
    if toucher <= behind:
        return None
    what = "reads slots its prefill" if kind == "offload" else "writes slots its forward"
    return (
        f"{kind} {what} of step {toucher} may still touch, but is ordered behind the whole "
        f"forward of step {behind} only"
    )


@dataclass(eq=False)
class CachedBlock:
    """One cached block: ``key`` is the prompt prefix through its last token."""

    key: tuple[int, ...]
    slots: list[int] | None = None
    """Its device slots (``None``: not on the device), and their SWA slots."""
    swa: list[int] = field(default_factory=list)
    host: int | None = None
    """Its host block (``None``: not in host memory)."""
    refs: int = 0
    """Running requests sharing its device slots: it is not evicted while any does."""


@dataclass
class PrefixMatch:
    """The cached blocks a prompt starts with, in order (:meth:`HostKVTier.match`)."""

    blocks: list[CachedBlock]
    block: int

    @property
    def shared(self) -> int:
        """Positions whose device slots the request shares (it needs no slots for them)."""
        return sum(self.block for b in self.blocks if b.slots is not None)

    @property
    def positions(self) -> int:
        """Positions the prefill reads instead of writing (shared or loaded back)."""
        return len(self.blocks) * self.block


Copy = Callable[[], None]


class HostKVTier:
    """The prefix cache of one engine (the target model's pool): device blocks shared by
    reference, ``host_tokens`` positions of host K/V (pinned on CUDA) in blocks of ``block``
    tokens, least recently used blocks evicted first from each tier. Host K/V is token-major
    (``[tokens, layers, heads, dim]``), so each block is one contiguous pinned range: every
    copy is a non-blocking one, with no host wait on CUDA either. ``deferred_free=False`` drops
    the done-event wait (a test setting: the load-back is then ordered behind the schedule
    stream only, sglang before #36738)."""

    def __init__(
        self,
        pool: KVPool,
        device: Device,
        stream: Stream,
        *,
        host_tokens: int,
        block: int,
        deferred_free: bool = True,
    ) -> None:
        if block < 1:
            raise ValueError(f"hicache block must be >= 1 token, got {block}")
        if host_tokens < block:
            raise ValueError(
                f"hicache host_tokens must be >= its block ({block}), got {host_tokens}"
            )
        self.pool = pool
        self.device = device
        self.stream = stream
        self.block = block
        self.deferred_free = deferred_free
        cfg = pool.cfg
        self.host_blocks = host_tokens // block
        shape = (self.host_blocks * block, cfg.layers, cfg.kv_heads, cfg.head_dim)
        self.pin = device.name == "cuda"
        self.host = [torch.zeros(shape, dtype=cfg.dtype, pin_memory=self.pin) for _ in range(4)]
        """Host K, V, SWA K, SWA V: the pool's four K/V tensors, token-major."""
        self.reset()

    def reset(self) -> None:
        """Empty the cache for a new run (runs compare with each other: no carried state)."""
        self.blocks: dict[tuple[int, ...], CachedBlock] = {}
        self.on_device: OrderedDict[tuple[int, ...], CachedBlock] = OrderedDict()
        self.in_host: OrderedDict[tuple[int, ...], CachedBlock] = OrderedDict()
        """Least recently used first, each; a chain is touched from its last block to its
        first, so a prefix outlives its extensions."""
        self.free_blocks = list(range(self.host_blocks - 1, -1, -1))
        self.freed_at = [0] * self.pool.num_slots
        self.newest = 0
        self.done: dict[int, Event] = {}
        self.stats = PrefixCacheStats()
        self._work: list[Copy] = []
        self._touchers: list[tuple[str, int]] = []
        self._wait_step = 0
        self.prefilled: dict[int, int] = {}
        """Request id -> the step of its prefill (the forward that writes its prompt KV)."""
        self.sharing: dict[int, list[CachedBlock]] = {}
        """Request id -> the device blocks it shares (their slots are not its own)."""
        self.whole = 0
        """The newest step whose whole forward the schedule stream is ordered after."""

    # -- the engine's side ------------------------------------------------------------------
    def launched(self, step: int, done: Event) -> None:
        """Step ``step`` is launched; ``done`` is recorded after its last forward."""
        self.newest = step
        self.done[step] = done
        # Every forward runs on one stream: a wait on a newer step's event covers older ones,
        # so only the steps that can still be a slot's newest toucher are kept.
        for old in [s for s in self.done if s < step - 8]:
            del self.done[old]

    def fenced(self, step: int, whole: bool) -> None:
        """The engine fenced the schedule stream after launching ``step``: behind its whole
        forward (a coarse barrier, a host sync), or behind its read-done event only (then
        behind every earlier step's whole forward, which precedes the event on the stream)."""
        self.whole = max(self.whole, step if whole else step - 1)

    # -- the scheduler's side ---------------------------------------------------------------
    def match(self, prompt: list[int]) -> PrefixMatch:
        """The cached blocks ``prompt`` starts with, leaving at least its last token to
        compute (the prefill samples from it). Changes nothing."""
        found: list[CachedBlock] = []
        b = self.block
        for n in range(1, (len(prompt) - 1) // b + 1):
            blk = self.blocks.get(tuple(prompt[: n * b]))
            if blk is None or (blk.slots is None and blk.host is None):
                break
            found.append(blk)
        return PrefixMatch(found, b)

    def admit(self, rid: int, prompt: list[int], match: PrefixMatch) -> None:
        """Request ``rid`` is admitted with ``match``: its shared blocks are referenced (not
        evicted until it is released), and the match is counted."""
        st = self.stats
        st.lookups += 1
        st.tokens_looked_up += len(prompt) - 1
        st.hits += bool(match.blocks)
        st.tokens_shared += match.shared
        st.tokens_loaded += match.positions - match.shared
        shared = [blk for blk in match.blocks if blk.slots is not None]
        for blk in shared:
            blk.refs += 1
        self.sharing[rid] = shared
        self._touch(match.blocks)

    def evict(self, keep: PrefixMatch | None) -> tuple[list[int], list[int]] | None:
        """Evict the least recently used device block no running request shares (nor
        ``keep``, the match being admitted): its slots and SWA slots, freed, or ``None`` when
        nothing can be evicted. Its host copy, if any, stays: nothing is copied."""
        pinned = {id(blk) for blk in keep.blocks} if keep is not None else set()
        victim = next(
            (b for b in self.on_device.values() if b.refs == 0 and id(b) not in pinned), None
        )
        if victim is None or victim.slots is None:
            return None
        del self.on_device[victim.key]
        slots, swa = victim.slots, victim.swa
        victim.slots, victim.swa = None, []
        self._freed(slots)
        self.stats.device_evictions += 1
        if victim.host is None:
            del self.blocks[victim.key]
        return slots, swa

    def load_back(self, loads: list[tuple[CachedBlock, list[int], list[int]]]) -> None:
        """Queue the copy of host blocks into fresh slots (block, its slots, its SWA slots),
        for one admitted request; :meth:`issue` launches it."""
        if not loads:
            return
        hosts = [blk.host for blk, _, _ in loads]
        assert all(h is not None for h in hosts)  # matched: on the device or in host memory
        slots = [s for _, block_slots, _ in loads for s in block_slots]
        swa = [s for _, _, block_swa in loads for s in block_swa]
        toucher = slot_ready_step(self.freed_at, slots)
        self._touchers.append(("load-back", toucher))
        if self.deferred_free:
            self._wait_step = max(self._wait_step, toucher)
        self._work.append(self._copy(slots, swa, [h for h in hosts if h is not None], False))

    def released(
        self, rid: int, prompt: list[int], slots: list[int], swa: list[int], *, offload: bool = True
    ) -> tuple[list[int], list[int]]:
        """A request is released: its shared blocks are dereferenced and (``offload``: it was
        served) its own full prompt blocks kept on the device and written through to host
        memory (the copy is launched by :meth:`issue`). Returns the slots and SWA slots that go
        back to the pool, each tagged with the newest launched step."""
        written = self.prefilled.pop(rid, self.newest)
        shared = self.sharing.pop(rid, [])
        for blk in shared:
            blk.refs -= 1
        mine = {s for sb in shared for s in sb.slots or []}
        kept = [s in mine for s in slots]
        chain: list[CachedBlock] = []
        out_slots: list[int] = []
        out_swa: list[int] = []
        out_hosts: list[int] = []
        b = self.block
        for i in range(min(len(prompt), len(slots)) // b if offload else 0):
            key = tuple(prompt[: (i + 1) * b])
            found = self.blocks.get(key)
            if found is not None and found.slots is not None:
                chain.append(found)  # on the device already: shared by this request, or another's
                continue
            blk = found if found is not None else CachedBlock(key)
            self.blocks[key] = blk
            blk.slots, blk.swa = slots[i * b : (i + 1) * b], swa[i * b : (i + 1) * b]
            kept[i * b : (i + 1) * b] = [True] * b
            chain.append(blk)
            if blk.host is None:
                blk.host = self._host_block()
                if blk.host is not None:
                    out_slots += blk.slots
                    out_swa += blk.swa
                    out_hosts.append(blk.host)
        self._touch(chain)
        if out_hosts:
            self.stats.tokens_offloaded += len(out_slots)
            self._work.append(self._copy(out_slots, out_swa, out_hosts, True))
            self._touchers.append(("offload", written))
        free = [s for s, k in zip(slots, kept, strict=True) if not k]
        free_swa = [s for s, k in zip(swa, kept, strict=True) if not k]
        self._freed(free)
        return free, free_swa

    def _freed(self, slots: Sequence[int]) -> None:
        for s in slots:
            self.freed_at[s] = self.newest

    def _touch(self, chain: list[CachedBlock]) -> None:
        for blk in reversed(chain):
            if blk.slots is not None:
                self.on_device[blk.key] = blk
                self.on_device.move_to_end(blk.key)
            if blk.host is not None:
                self.in_host[blk.key] = blk
                self.in_host.move_to_end(blk.key)

    def _host_block(self) -> int | None:
        """A free host block, evicting the least recently used one for it (copies still
        queued from or into an evicted block run first: one stream, in order)."""
        if not self.free_blocks and self.in_host:
            _, old = self.in_host.popitem(last=False)
            assert old.host is not None
            self.free_blocks.append(old.host)
            old.host = None
            self.stats.evictions += 1
            if old.slots is None:
                del self.blocks[old.key]
        return self.free_blocks.pop() if self.free_blocks else None

    def _copy(self, slots: list[int], swa: list[int], hosts: list[int], to_host: bool) -> Copy:
        """One copy between device ``slots`` / ``swa`` and host blocks ``hosts`` (a block's
        worth of slots each, in order), adjacent host blocks as one range."""
        ranges: list[tuple[int, int]] = []
        for blk in hosts:
            a, b = blk * self.block, (blk + 1) * self.block
            if ranges and ranges[-1][1] == a:
                ranges[-1] = (ranges[-1][0], b)
            else:
                ranges.append((a, b))
        idx, idx_swa = self._index(slots), self._index(swa)
        pool, (hk, hv, hsk, hsv) = self.pool, self.host
        dev = pool.k.device

        def copy() -> None:
            s, ss = idx.to(dev, non_blocking=True), idx_swa.to(dev, non_blocking=True)
            pairs = ((hk, pool.k, s), (hv, pool.v, s), (hsk, pool.swa_k, ss), (hsv, pool.swa_v, ss))
            for host, kv, i in pairs:
                if to_host:
                    gathered = kv[:, i].transpose(0, 1).contiguous()  # [tokens, layers, ...]
                    at = 0
                    for a, b in ranges:
                        host[a:b].copy_(gathered[at : at + b - a], non_blocking=True)
                        at += b - a
                else:
                    parts = [host[a:b].to(dev, non_blocking=True) for a, b in ranges]
                    kv[:, i] = torch.cat(parts).transpose(0, 1)

        return copy

    def _index(self, values: list[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.int64)
        return t.pin_memory() if self.pin else t

    def issue(self, schedule_stream: Stream) -> None:
        """Launch the queued copies on the tier's stream, behind the schedule stream's writes
        (and, for load-backs into slots a forward may still touch, behind that step's done
        event). Copies run in queue order: a slot's offload before a load-back into it."""
        if not self._work:
            return
        work, self._work = self._work, []
        touchers, self._touchers = self._touchers, []
        wait, self._wait_step = self._wait_step, 0
        self.stream.wait_stream(schedule_stream)
        behind = self.whole
        event = self.done.get(wait) if wait else None
        if event is not None:
            self.stats.done_waits += 1
            self.stream.wait_event(event)
            behind = max(behind, wait)
        elif wait:  # older than the kept events: the host has collected a later step
            behind = max(behind, wait)
        st = self.stats
        for kind, toucher in touchers:
            st.copies_checked += 1
            problem = copy_order_problem(kind, toucher, behind)
            if problem is not None and len(st.unordered) < 20:
                st.unordered.append(problem)
        with self.device.use_stream(self.stream):
            for fn in work:
                self.device.launch(fn, "hicache_copy")
