"""The host KV tier behind the ``hicache`` engine flag: a small prefix cache in host memory.

What it models (sglang's hierarchical cache, write-through): a request's prompt KV is copied
to host memory when the request is released (its slots go back to the pool), keyed by the
prompt's block-aligned prefixes; a new request whose prompt starts with a cached prefix gets
that prefix's KV loaded back into its freshly allocated slots before its prefill, and its
prefill reuses it (see :meth:`HostKVTier.cached_prefix`). Both copies run on the tier's own
``hicache`` stream, which is ordered behind the schedule stream only, as in sglang:

* the offload reads the released request's prompt slots: when that request's prefill is the
  forward in flight, only the whole-forward barrier after the prefill (the built-in veto of the
  prefill fast path when ``hicache`` is on) makes the schedule stream, and so the copy, wait
  until the prefill has written them;
* the load-back writes slots the scheduler just handed out, which may have been freed by a
  request whose last forward is still in flight (the slot pool is a stack: a freed slot is the
  next one handed out). Each freed slot is tagged with the newest launched step; the load-back
  first makes its stream wait on that step's *done event* (recorded on the forward stream after
  the step's last forward): a device wait, never a host sync. vLLM's rule (#45357) in device
  time; sglang #36738 fenced the load-back behind the whole forward stream.

The forward stream waits on the tier's stream before every launch (it reads what the load-back
wrote, and its writes must follow the offload's reads of the slots it reuses).

Rows of ``req_to_token`` are not part of this: they stay immediately reusable, since their
rewrite is what the read-done fence protects.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from warcore.batch import KVPool
from warcore.device import Device, Event, Stream

__all__ = ["HostKVTier", "PrefixCacheStats", "copy_order_problem", "slot_ready_step"]


@dataclass
class PrefixCacheStats:
    """What the host KV tier did in one run (``RunReport.prefix_cache``)."""

    lookups: int = 0
    """Admitted prefills whose prompt was looked up."""
    hits: int = 0
    """Lookups that found a cached prefix (at least one block)."""
    tokens_looked_up: int = 0
    """Prompt tokens of the lookups (each prompt's last token is never cached)."""
    tokens_loaded: int = 0
    """Prompt tokens whose KV was loaded back from host memory."""
    tokens_offloaded: int = 0
    """Prompt tokens whose KV was copied to host memory."""
    evictions: int = 0
    """Host entries dropped to make room (least recently used first)."""
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
        return self.tokens_loaded / self.tokens_looked_up if self.tokens_looked_up else 0.0

    def format(self) -> str:
        return (
            f"{self.hits}/{self.lookups} prefills hit ({self.hit_rate:.0%}), "
            f"{self.tokens_loaded}/{self.tokens_looked_up} prompt tokens loaded back "
            f"({self.token_hit_rate:.0%}), {self.tokens_offloaded} offloaded, "
            f"{self.evictions} evicted, {self.done_waits} load-backs behind a done event"
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


@dataclass
class _Entry:
    key: tuple[int, ...]
    blocks: list[int]
    """Host blocks, one per ``block`` cached positions, in order."""
    keys: list[tuple[int, ...]] = field(default_factory=list)
    """The block-aligned prefixes indexed to this entry."""


class HostKVTier:
    """The host KV tier of one engine (the target model's pool): ``host_tokens`` positions of
    host K/V (pinned on CUDA) in blocks of ``block`` tokens, block-aligned prefix keys, least
    recently used entries evicted first. Host K/V is token-major (``[tokens, layers, heads,
    dim]``), so each block is one contiguous pinned range: every copy is a non-blocking one,
    with no host wait on CUDA either. ``deferred_free=False`` drops the done-event wait (a test
    setting: the load-back is then ordered behind the schedule stream only, sglang before
    #36738)."""

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
        """Empty the tier for a new run (runs compare with each other: no carried state)."""
        self.entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.index: dict[tuple[int, ...], _Entry] = {}
        self.free_blocks = list(range(self.host_blocks - 1, -1, -1))
        self.freed_at = [0] * self.pool.num_slots
        self.newest = 0
        self.done: dict[int, Event] = {}
        self.stats = PrefixCacheStats()
        self._work: list[Callable[[], None]] = []
        self._touchers: list[tuple[str, int]] = []
        self._wait_step = 0
        self.prefilled: dict[int, int] = {}
        """Request id -> the step of its prefill (the forward that writes its prompt KV)."""
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
    def cached_prefix(self, prompt: list[int]) -> int:
        """Look ``prompt`` up: the length of its longest cached block-aligned prefix that
        leaves at least its last token to compute (the prefill samples from it)."""
        st = self.stats
        st.lookups += 1
        st.tokens_looked_up += len(prompt) - 1
        for n in range((len(prompt) - 1) // self.block, 0, -1):
            entry = self.index.get(tuple(prompt[: n * self.block]))
            if entry is not None:
                self.entries.move_to_end(entry.key)
                st.hits += 1
                st.tokens_loaded += n * self.block
                return n * self.block
        return 0

    def load_back(self, prompt: list[int], length: int, slots: list[int], swa: list[int]) -> None:
        """Queue the copy of the first ``length`` cached positions of ``prompt`` into
        ``slots`` / ``swa`` (this request's fresh slots); :meth:`issue` launches it."""
        entry = self.index[tuple(prompt[:length])]
        ranges = self._ranges(entry.blocks[: length // self.block])
        dst, dst_swa = self._index(slots[:length]), self._index(swa[:length])
        toucher = slot_ready_step(self.freed_at, slots[:length])
        self._touchers.append(("load-back", toucher))
        if self.deferred_free:
            self._wait_step = max(self._wait_step, toucher)
        pool, (hk, hv, hsk, hsv) = self.pool, self.host
        dev = pool.k.device

        def load() -> None:
            d, ds = dst.to(dev, non_blocking=True), dst_swa.to(dev, non_blocking=True)
            pairs = ((hk, pool.k, d), (hv, pool.v, d), (hsk, pool.swa_k, ds), (hsv, pool.swa_v, ds))
            for host, kv, idx in pairs:
                parts = [host[a:b].to(dev, non_blocking=True) for a, b in ranges]
                kv[:, idx] = torch.cat(parts).transpose(0, 1)

        self._work.append(load)

    def released(
        self, rid: int, prompt: list[int], slots: list[int], swa: list[int], *, offload: bool = True
    ) -> None:
        """A request's slots go back to the pool: tag them with the newest launched step and
        (``offload``: it was served) queue the offload of its prompt KV (write-through; the
        copy is launched by :meth:`issue`, before any load-back the same step queues into
        these slots)."""
        for s in slots:
            self.freed_at[s] = self.newest
        written = self.prefilled.pop(rid, self.newest)
        length = min(len(prompt), len(slots)) // self.block * self.block
        if length == 0 or not offload:
            return
        key = tuple(prompt[:length])
        known = self.index.get(key)
        if known is not None:  # already cached: refresh it, copy nothing
            self.entries.move_to_end(known.key)
            return
        blocks = self._host_blocks(length // self.block)
        if blocks is None:
            return
        entry = _Entry(key, blocks)
        self.entries[key] = entry
        for n in range(1, length // self.block + 1):
            k = key[: n * self.block]
            self.index[k] = entry
            entry.keys.append(k)
        self.stats.tokens_offloaded += length
        src, src_swa = self._index(slots[:length]), self._index(swa[:length])
        ranges = self._ranges(blocks)
        pool, (hk, hv, hsk, hsv) = self.pool, self.host
        dev = pool.k.device

        def copy_out() -> None:
            s, ss = src.to(dev, non_blocking=True), src_swa.to(dev, non_blocking=True)
            pairs = ((hk, pool.k, s), (hv, pool.v, s), (hsk, pool.swa_k, ss), (hsv, pool.swa_v, ss))
            for host, kv, idx in pairs:
                gathered = kv[:, idx].transpose(0, 1).contiguous()  # [tokens, layers, ...]
                at = 0
                for a, b in ranges:
                    host[a:b].copy_(gathered[at : at + b - a], non_blocking=True)
                    at += b - a

        self._work.append(copy_out)
        self._touchers.append(("offload", written))

    def _host_blocks(self, n: int) -> list[int] | None:
        """``n`` free host blocks, evicting least recently used entries for them (copies
        still queued from an evicted entry run first: one stream, in order)."""
        while len(self.free_blocks) < n and self.entries:
            _, old = self.entries.popitem(last=False)
            for k in old.keys:
                if self.index.get(k) is old:
                    del self.index[k]
            self.free_blocks.extend(old.blocks)
            self.stats.evictions += 1
        if len(self.free_blocks) < n:
            return None
        return [self.free_blocks.pop() for _ in range(n)]

    def _ranges(self, blocks: list[int]) -> list[tuple[int, int]]:
        """Host token ranges of ``blocks``, adjacent ones merged (fewer, larger copies)."""
        out: list[tuple[int, int]] = []
        for blk in blocks:
            a, b = blk * self.block, (blk + 1) * self.block
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out

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
