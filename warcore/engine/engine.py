"""The overlap engine: launch N, fence, process N-1, schedule N+1 while N runs.

One step of the overlap loop::

    batch N+1's shared writes   (schedule stream, already fenced against forward N's reads)
    forward_stream.wait_stream(schedule_stream)          # RAW: N+1 reads what was written
    launch forward N+1                                   # forward stream
    barrier: take the runner's mailbox                   # WAR, for the writes of N+2
        event  -> schedule_stream.wait_event(event)      # fine
        none   -> schedule_stream.wait_stream(forward)   # coarse
    process forward N's tokens                           # host sync on N only

The serial loop waits for each forward before scheduling the next one; it builds the same
batches, so its tokens are the oracle for the overlap loop.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from warcore.attention import AttentionBackend
from warcore.core import (
    BoundaryContext,
    ForwardMode,
    RecordPoint,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
    get_registry,
)
from warcore.device import Device, get_device
from warcore.engine.kv_pool import KVPool
from warcore.engine.model import ModelConfig, TinyLlama
from warcore.engine.requests import Request
from warcore.engine.scheduler import Scheduled, Scheduler, SchedulerConfig
from warcore.runners import EagerRunner, GraphRunner, ModelRunner, StepOutput, default_buckets

__all__ = ["Engine", "EngineConfig", "FENCES", "LOOPS", "RunReport"]

Fence = Literal["fine", "coarse", "none"]
Loop = Literal["overlap", "serial"]
FENCES: tuple[Fence, ...] = ("fine", "coarse", "none")
LOOPS: tuple[Loop, ...] = ("overlap", "serial")


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "torch_native"
    algorithm: str = "none"
    fence: Fence = "fine"
    loop: Loop = "overlap"
    use_graphs: bool = True
    plant_node: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    num_slots: int = 4096
    max_prompt: int = 64
    flags: tuple[tuple[str, bool | int | str], ...] = ()

    def __post_init__(self) -> None:
        if self.fence not in FENCES:
            raise ValueError(f"unknown fence {self.fence!r}; valid: {', '.join(FENCES)}")
        if self.loop not in LOOPS:
            raise ValueError(f"unknown loop {self.loop!r}; valid: {', '.join(LOOPS)}")


@dataclass
class RunReport:
    config: EngineConfig
    device: str
    requests: int
    tokens: int
    elapsed_s: float
    steps: int
    forwards: Counter[ForwardMode]
    published: Counter[tuple[ForwardMode, RecordPoint]]
    barriers: Counter[str]
    outputs: dict[int, list[int]]
    errors: dict[int, str]
    rows_reused: int = 0
    matches_serial: bool | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Engine:
    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        device: Device | str | None = None,
        pm: WarcorePluginManager | None = None,
    ) -> None:
        self.config = cfg = config or EngineConfig()
        self.pm = pm if pm is not None else get_plugin_manager()
        registry = get_registry(self.pm)
        registry.algorithm(cfg.algorithm)  # unknown names fail here, listing the valid ones
        spec = registry.backend(cfg.backend)
        self.device = device if isinstance(device, Device) else get_device(device)
        tdev = self.device.torch_device
        sc = cfg.scheduler
        self.model = TinyLlama(cfg.model, tdev)
        self.pool = KVPool(cfg.model, tdev, max_reqs=sc.max_running + 1, num_slots=cfg.num_slots)
        capacity = max(sc.max_prefill_tokens, sc.max_prefill_requests * cfg.max_prompt, sc.max_running)
        self.context = BoundaryContext(cfg.algorithm, dict(cfg.flags))
        backend = spec.factory(
            pool=self.pool, max_bs=sc.max_running, capacity=capacity, context=self.context
        )
        if not isinstance(backend, AttentionBackend) or backend.name != cfg.backend:
            raise TypeError(
                f"backend factory for {cfg.backend!r} returned {backend!r}; expected an "
                f"AttentionBackend named {cfg.backend!r}"
            )
        self.backend = backend
        self.forward_stream = self.device.new_stream("forward")
        self.schedule_stream = self.device.new_stream("schedule")
        self.runner = ModelRunner(
            device=self.device,
            forward_stream=self.forward_stream,
            model=self.model,
            pool=self.pool,
            backend=backend,
            context=self.context,
            decisions=get_decision_cache(self.pm),
            max_bs=sc.max_running,
            capacity=capacity,
        )
        self.eager = EagerRunner(self.runner)
        self.decode_graph = (
            GraphRunner(
                self.runner,
                ForwardMode.DECODE,
                1,
                default_buckets(sc.max_running),
                plant_node=cfg.plant_node,
            )
            if cfg.use_graphs
            else None
        )
        self.barriers: Counter[str] = Counter()

    def close(self) -> None:
        self.device.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one forward ----------------------------------------------------------------------
    def launch(self, scheduled: Scheduled) -> StepOutput:
        step = scheduled.step
        self.forward_stream.wait_stream(self.schedule_stream)
        with self.device.use_stream(self.forward_stream):
            if self.decode_graph is not None and self.decode_graph.can_run(step):
                return self.decode_graph.run(step)
            return self.eager.run(step)

    def barrier(self) -> None:
        """WAR fence for the scheduler's next writes (sglang's ``_apply_war_barrier``)."""
        event = self.runner.mailbox.take()
        fence = self.config.fence
        if fence == "none":
            self.barriers["none"] += 1
        elif fence == "fine" and event is not None:
            self.schedule_stream.wait_event(event)
            self.barriers["fine"] += 1
        else:
            self.schedule_stream.wait_stream(self.forward_stream)
            self.barriers["coarse"] += 1

    # -- the loop -------------------------------------------------------------------------
    def run(
        self,
        requests: list[Request],
        progress: Callable[[int, int], None] | None = None,
    ) -> RunReport:
        reqs = [r.fresh() for r in requests]
        sched = Scheduler(reqs, self.pool, self.device, self.schedule_stream, self.config.scheduler)
        serial = self.config.loop == "serial"
        forwards: Counter[ForwardMode] = Counter()
        self.runner.published.clear()
        self.barriers.clear()
        pending: tuple[Scheduled, StepOutput] | None = None
        done_tokens = 0
        total_tokens = sum(r.max_new_tokens for r in reqs)
        step = 0
        start = time.perf_counter()
        while not sched.finished_scheduling:
            scheduled = sched.schedule(step)
            if scheduled is None:
                if pending is not None:
                    done_tokens += _collect(*pending)
                    pending = None
                nxt = sched.next_arrival()
                step = max(step + 1, nxt if nxt is not None else step + 1)
                continue
            out = self.launch(scheduled)
            sched.on_launched(scheduled)
            forwards[scheduled.step.forward_mode] += 1
            if serial:
                self.device.synchronize()
                done_tokens += _collect(scheduled, out)
            else:
                self.barrier()
                if pending is not None:
                    done_tokens += _collect(*pending)
                pending = (scheduled, out)
            if progress is not None:
                progress(done_tokens, total_tokens)
            step += 1
        if pending is not None:
            done_tokens += _collect(*pending)
        self.device.synchronize()
        elapsed = time.perf_counter() - start
        if progress is not None:
            progress(done_tokens, total_tokens)
        return RunReport(
            config=self.config,
            device=self.device.name,
            requests=len(reqs),
            tokens=sum(len(r.output) for r in reqs),
            elapsed_s=elapsed,
            steps=step,
            forwards=forwards,
            published=Counter(self.runner.published),
            barriers=Counter(self.barriers),
            outputs={r.rid: list(r.output) for r in reqs},
            errors={r.rid: r.error for r in reqs if r.error is not None},
            rows_reused=sched.rows_reused,
        )


def _collect(scheduled: Scheduled, out: StepOutput) -> int:
    """Append each request's sampled token; the host waits for this forward only."""
    tokens = out.result()
    step = scheduled.step
    for i, req in enumerate(scheduled.requests):
        req.output.append(tokens[i][step.sample_index[i]])
    return len(scheduled.requests)
