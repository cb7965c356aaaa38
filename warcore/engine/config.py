"""What an engine runs: :class:`EngineConfig`, validated when it is made."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Literal

from warcore.engine.model import ModelConfig
from warcore.engine.scheduler import SchedulerConfig

__all__ = [
    "COPY_WAITS",
    "FENCES",
    "IN_GRAPH_EVENTS",
    "LOOPS",
    "MAX_MODELLED_S",
    "STAGINGS",
    "CopyWait",
    "EngineConfig",
    "Fence",
    "InGraphEvent",
    "Loop",
    "Staging",
]

Fence = Literal["fine", "coarse", "none"]
Loop = Literal["overlap", "serial"]
CopyWait = Literal["none", "at-barrier", "after-next-launch"]
Staging = Literal["ring", "fresh"]
InGraphEvent = Literal["persistent", "ring"]
FENCES: tuple[Fence, ...] = ("fine", "coarse", "none")
LOOPS: tuple[Loop, ...] = ("overlap", "serial")
COPY_WAITS: tuple[CopyWait, ...] = ("none", "at-barrier", "after-next-launch")
STAGINGS: tuple[Staging, ...] = ("ring", "fresh")
IN_GRAPH_EVENTS: tuple[InGraphEvent, ...] = ("persistent", "ring")


MAX_MODELLED_S = 1.0
"""The most modelled device time :class:`EngineConfig` takes per layer (``modelled_layer_s``)
or per step (``schedule_work_s``): a second. More is a typo (``--layer-ms 1e308`` once failed
mid-run with an overflow in the sim device's clock)."""


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "torch_native"
    algorithm: str = "none"
    fence: Fence = "fine"
    loop: Loop = "overlap"
    use_graphs: bool = True
    plant_node: bool = True
    num_draft: int = 4
    """Draft tokens per verify (the dflash block size, the EAGLE draft steps)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_slots: int = 4096
    max_prompt: int = 64
    schedule_work_s: float = 0.0
    """Extra scheduler device work per step (a modelled host-to-device copy), for benchmarks."""
    modelled_layer_s: float = 0.0
    """Extra device time per model layer that uses no CPU (sim only): makes the tiny CPU
    forward behave like a GPU's, whose kernels do not compete with the host for the CPU and
    the GIL. Benchmarks state the value they use; 0 for tests."""
    copy_wait: CopyWait = "none"
    """A second consumer of the step's read-done event, on a ``copy`` stream (the overlap
    loop only): ``at-barrier`` waits right after the barrier; ``after-next-launch`` waits only
    after the next step is launched, the shape of sglang #31072's copy-side wait (with the
    persistent in-graph event it binds to the *next* forward's record; the binding audit
    reports it)."""
    event_ring_depth: int | None = None
    """Events per publishing runner's ring (``None``: the depth its records in flight need,
    derived from the step and the consumers); a shallower one is refused at start-up."""
    in_graph_event: InGraphEvent = "persistent"
    """The read-done event a captured graph's record node records: ``persistent``, one
    external event per graph runner that every replay re-arms (sglang 0.5.23's), or ``ring``,
    one graph per ring slot and bucket, each captured with its own event, replay ``i`` running
    slot ``i mod depth`` (the depth as the runner's event ring derives it), so a consumer that
    waits later still binds to its own forward's record. See docs/event-lifetime.md."""
    staging: Staging = "ring"
    """How each forward's host inputs reach the device: through a ring of persistent (pinned,
    on CUDA) host buffers, as real engines do, or ``"fresh"`` host tensors every forward."""
    staging_depth: int = 0
    """Ring slots per runner; 0 derives it from the steps in flight
    (:func:`~warcore.batch.staging_depth`)."""
    staging_guard: bool = True
    """Guard each slot with its forward's release event (vLLM V1's shape); ``False`` relies on
    the depth alone (vLLM V2's), which is sound only when it is at least the derived depth."""
    prefill_staging: bool = True
    """Stage, then publish (sglang #38554): call the algorithm's
    ``prefill_shared_read_stager`` for each prefill batch whose step reads the shared buffers
    later (EAGLE's draft prompt pass), so a staged batch may publish its early prefill event.
    ``False`` never calls it: those prefills keep the coarse fence (no early publish)."""
    hicache_host_tokens: int = 2048
    """Host KV tier (engine flag ``hicache``): prompt positions of K/V it keeps in host
    memory, least recently used prefixes evicted first."""
    hicache_block: int = 4
    """Host KV tier: prefixes are cached and matched in blocks of this many tokens."""
    hicache_deferred_free: bool = True
    """Host KV tier: a load-back into freed slots waits on the done event of the newest step
    that may still touch them. ``False`` is a test setting (sglang before #36738: ordered
    behind the schedule stream only), which races."""
    flags: tuple[tuple[str, bool | int | str], ...] = ()
    """Engine flags as (name, value) pairs: only declared flags (the core's ``CORE_FLAGS`` and
    what plugins declare through ``warcore_engine_flags``), each value of its flag's kind;
    :class:`Engine` raises :class:`ValueError` naming anything else."""

    def __post_init__(self) -> None:
        for f in fields(self):  # first: the checks below assume each field's type
            problem = _type_problem(getattr(self, f.name), _field_types()[f.name])
            if problem is not None:
                raise ValueError(f"{f.name} must be {problem}, got {getattr(self, f.name)!r}")
        if self.fence not in FENCES:
            raise ValueError(f"unknown fence {self.fence!r}; valid: {', '.join(FENCES)}")
        if self.loop not in LOOPS:
            raise ValueError(f"unknown loop {self.loop!r}; valid: {', '.join(LOOPS)}")
        if self.copy_wait not in COPY_WAITS:
            raise ValueError(
                f"unknown copy_wait {self.copy_wait!r}; valid: {', '.join(COPY_WAITS)}"
            )
        ring = self.event_ring_depth
        if ring is not None and ring < 1:
            raise ValueError(f"event_ring_depth must be an int >= 1, got {ring!r}")
        if self.in_graph_event not in IN_GRAPH_EVENTS:
            raise ValueError(
                f"unknown in_graph_event {self.in_graph_event!r}; valid: "
                f"{', '.join(IN_GRAPH_EVENTS)}"
            )
        if self.staging not in STAGINGS:
            raise ValueError(f"unknown staging {self.staging!r}; valid: {', '.join(STAGINGS)}")
        if self.staging_depth < 0:
            raise ValueError(
                f"staging_depth must be an int >= 0 (0: derived), got {self.staging_depth!r}"
            )
        if self.num_slots < 2:
            raise ValueError(
                f"num_slots must be an int >= 2 (slot 0 is the dummy), got {self.num_slots!r}"
            )
        for name in ("hicache_host_tokens", "hicache_block", "max_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.hicache_host_tokens < self.hicache_block:
            raise ValueError(
                f"hicache_host_tokens ({self.hicache_host_tokens}) must hold at least one "
                f"block (hicache_block {self.hicache_block})"
            )
        if self.num_draft < 1:
            raise ValueError(f"num_draft must be at least 1, got {self.num_draft}")
        if self.num_draft > self._by_batch:
            sc = self.scheduler
            raise ValueError(
                f"num_draft {self.num_draft} is more than this engine can run: at most "
                f"{self._by_batch} (a verify batch of {sc.max_running} requests x (num_draft + "
                f"1) tokens must fit the engine's {self.token_capacity}-token batch)"
            )
        for name in ("schedule_work_s", "modelled_layer_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
            if value > MAX_MODELLED_S:
                raise ValueError(
                    f"{name} must be at most {MAX_MODELLED_S:g} s (modelled device time per "
                    f"layer or step), got {value!r}"
                )

    @property
    def token_capacity(self) -> int:
        """Tokens one batch may hold: the static buffers every runner (graph or eager) has."""
        sc = self.scheduler
        return max(
            sc.max_prefill_tokens, sc.max_prefill_requests * self.max_prompt, sc.max_running * 8
        )

    @property
    def max_num_draft(self) -> int:
        """The widest speculation this configuration can run (31 by default): a verify batch of
        ``scheduler.max_running`` requests x ``num_draft + 1`` tokens must fit
        :attr:`token_capacity` (checked when the config is made), and a one-token request's KV
        budget (``1 + 2 * num_draft`` positions, see :meth:`Request.kv_budget`) the model's
        context and the KV pool (checked by the engine for a speculative algorithm only:
        :meth:`speculation_problem`)."""
        return min(self._by_batch, self._by_context)

    @property
    def _by_batch(self) -> int:
        return self.token_capacity // max(1, self.scheduler.max_running) - 1

    @property
    def _by_context(self) -> int:
        return (min(self.model.max_context, self.num_slots - 1) - 1) // 2

    def speculation_problem(self) -> str | None:
        """Why a speculative algorithm cannot run ``num_draft`` drafts in this KV room, naming
        the options that would make room (``None``: it can). A request reserves
        ``2 x num_draft`` KV positions beyond its tokens; without speculation it reserves
        none, so the engine asks this only of a speculative algorithm."""
        n, context = self.num_draft, min(self.model.max_context, self.num_slots - 1)
        if n <= self._by_context:
            return None
        head = (
            f"algorithm {self.algorithm!r} with num_draft {n} needs KV room for 2 x num_draft "
            f"positions beyond a request's tokens, {2 * n + 1} at least"
        )
        fewer = f"num_draft <= {max(1, (self.model.max_context - 1) // 2)}"
        if 2 * n + 1 > self.model.max_context:  # more slots cannot help
            return f"{head}; the model's max_context is {self.model.max_context}: give {fewer}"
        fewer = f" or num_draft <= {self._by_context}" if self._by_context >= 1 else ""
        return (
            f"{head}; num_slots {self.num_slots} leaves {context} (slot 0 is the dummy): give "
            f"num_slots >= {2 * n + 2}{fewer}"
        )


@cache
def _field_types() -> dict[str, object]:
    """:class:`EngineConfig`'s field annotations, resolved (the module's names are needed)."""
    return typing.get_type_hints(EngineConfig)


_KINDS: dict[object, str] = {bool: "a bool", int: "an int", float: "a number", str: "a str"}


def _type_problem(value: object, hint: object) -> str | None:
    """What ``hint`` asks for (``"a bool"``), if ``value`` is not it; ``None`` if it is. A bool
    is not an int here (``staging_guard=0`` once turned the guard off), an int is a number, a
    ``Literal`` asks for a str (its own check names the valid ones)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        wrong = [_type_problem(value, option) for option in options]
        return None if None in wrong else " or ".join(w for w in wrong if w)
    if hint is type(None):
        return None if value is None else "None"
    if origin is Literal:
        hint = str
    elif origin is not None:
        hint = origin  # tuple[...]: the flags' pairs are the registry's to check
    if hint in (int, float):
        ok = isinstance(value, int | float if hint is float else int)
        ok = ok and not isinstance(value, bool)
    else:
        ok = type(value) is bool if hint is bool else isinstance(value, hint)  # type: ignore[arg-type]
    return None if ok else _KINDS.get(hint, f"a {getattr(hint, '__name__', hint)}")
