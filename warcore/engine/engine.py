"""The overlap engine: launch N, fence, process N-1, schedule N+1 while N runs.

One step of the overlap loop::

    batch N+1's shared writes   (schedule stream, already fenced against forward N's reads)
    forward_stream.wait_stream(schedule_stream)          # RAW: N+1 reads what was written
    launch step N+1 (all forwards of the algorithm)      # forward stream
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
from warcore.device import Device, DeviceError, get_device
from warcore.engine.kv_pool import KVPool
from warcore.engine.model import ModelConfig, TinyLlama
from warcore.engine.observe import EngineObserver
from warcore.engine.requests import Request
from warcore.engine.scheduler import Scheduled, Scheduler, SchedulerConfig
from warcore.engine.spec import DflashWorker, EagleWorker, PlainWorker, Worker, build_drafter
from warcore.runners import ModelRunner, RowState, RunnerGroup, StepOutput

__all__ = ["FENCES", "LOOPS", "Engine", "EngineConfig", "EngineFailed", "RunReport"]

Fence = Literal["fine", "coarse", "none"]
Loop = Literal["overlap", "serial"]
FENCES: tuple[Fence, ...] = ("fine", "coarse", "none")
LOOPS: tuple[Loop, ...] = ("overlap", "serial")


class EngineFailed(RuntimeError):
    """The engine was asked to run after a device fault stopped it."""


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
    flags: tuple[tuple[str, bool | int | str], ...] = ()

    def __post_init__(self) -> None:
        if self.fence not in FENCES:
            raise ValueError(f"unknown fence {self.fence!r}; valid: {', '.join(FENCES)}")
        if self.loop not in LOOPS:
            raise ValueError(f"unknown loop {self.loop!r}; valid: {', '.join(LOOPS)}")
        if self.num_draft < 1:
            raise ValueError(f"num_draft must be at least 1, got {self.num_draft}")


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
    """Per (forward mode, record point): forwards of every runner (target and draft)."""
    barriers: Counter[str]
    outputs: dict[int, list[int]]
    errors: dict[int, str]
    rows_reused: int = 0
    verifies: int = 0
    """Request-verifies: one per request per target verify."""
    accepted_drafts: int = 0
    stopped: str | None = None
    """The device fault that stopped the run, if one did."""
    matches_serial: bool | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean draft tokens accepted per verify (the bonus token not counted)."""
        return self.accepted_drafts / self.verifies if self.verifies else 0.0


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
        algorithm = registry.algorithm(cfg.algorithm)  # unknown names list the valid ones
        backend_spec = registry.backend(cfg.backend)
        self.family = algorithm.family
        self.num_draft = 0 if self.family == "none" else cfg.num_draft
        self.device = device if isinstance(device, Device) else get_device(device)
        tdev = self.device.torch_device
        sc = cfg.scheduler
        self.context = BoundaryContext(cfg.algorithm, dict(cfg.flags))
        self.capacity = max(
            sc.max_prefill_tokens, sc.max_prefill_requests * cfg.max_prompt, sc.max_running * 8
        )
        self.model = TinyLlama(cfg.model, tdev)
        self.pool = KVPool(cfg.model, tdev, max_reqs=sc.max_running + 1, num_slots=cfg.num_slots)
        self.rows = RowState(
            tdev, self.pool.max_reqs, cfg.model.hidden, cfg.model.dtype, self.num_draft
        )
        self.forward_stream = self.device.new_stream("forward")
        self.schedule_stream = self.device.new_stream("schedule")
        width = self.num_draft + 1
        target_mode = ForwardMode.TARGET_VERIFY if self.num_draft else ForwardMode.DECODE
        self.target = self._group(
            "target", self.model, self.pool, backend_spec.factory, {target_mode: width}
        )
        self.runner = self.target.runner
        self.worker: Worker
        if self.family == "none":
            self.worker = PlainWorker(self.target)
        elif self.family == "dflash":
            drafter = build_drafter(
                algorithm.drafter, cfg.algorithm, self.model, self.num_draft, tdev
            )
            self.worker = DflashWorker(self.target, drafter)
        elif self.family == "eagle":
            draft_model = build_drafter(
                algorithm.drafter, cfg.algorithm, self.model, self.num_draft, tdev
            )
            draft_pool = KVPool(
                draft_model.cfg,
                tdev,
                max_reqs=self.pool.max_reqs,
                num_slots=cfg.num_slots,
                share_tables_with=self.pool,
            )
            modes = {ForwardMode.DECODE: 1, ForwardMode.DRAFT_EXTEND_V2: width}
            draft = self._group("draft", draft_model, draft_pool, backend_spec.factory, modes)
            self.worker = EagleWorker(self.target, draft, self.num_draft)
        else:
            raise ValueError(
                f"algorithm {cfg.algorithm!r} has family {self.family!r}; the reference engine "
                "runs the families none, eagle and dflash"
            )
        self.barriers: Counter[str] = Counter()
        self.failure: DeviceError | None = None
        # Capture's warm-up forwards are queued on the forward stream: finish them here, so a
        # run's time is the run's, and a fault during capture surfaces at construction.
        self.device.synchronize()

    def _group(
        self,
        name: str,
        model: TinyLlama,
        pool: KVPool,
        factory: Callable[..., object],
        graph_modes: dict[ForwardMode, int],
    ) -> RunnerGroup:
        cfg, sc = self.config, self.config.scheduler
        backend = factory(
            pool=pool, max_bs=sc.max_running, capacity=self.capacity, context=self.context
        )
        if not isinstance(backend, AttentionBackend) or backend.name != cfg.backend:
            raise TypeError(
                f"backend factory for {cfg.backend!r} returned {backend!r}; expected an "
                f"AttentionBackend named {cfg.backend!r}"
            )
        runner = ModelRunner(
            device=self.device,
            forward_stream=self.forward_stream,
            model=model,
            pool=pool,
            backend=backend,
            context=self.context,
            decisions=get_decision_cache(self.pm),
            rows=self.rows,
            max_bs=sc.max_running,
            capacity=self.capacity,
            name=name,
            draft=name == "draft",
            modelled_layer_s=cfg.modelled_layer_s,
        )
        return RunnerGroup(
            runner, graph_modes, use_graphs=cfg.use_graphs, plant_node=cfg.plant_node
        )

    @property
    def runners(self) -> list[ModelRunner]:
        draft = getattr(self.worker, "draft", None)
        return [self.target.runner] + ([draft.runner] if draft is not None else [])

    def close(self) -> None:
        backends = [r.backend for r in self.runners]
        caches = [get_decision_cache(self.pm), *(r.decisions for r in self.runners)]
        for cache in {id(c): c for c in caches}.values():
            cache.forget(backends)
        self.device.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one step -------------------------------------------------------------------------
    def launch(self, scheduled: Scheduled) -> StepOutput:
        self.forward_stream.wait_stream(self.schedule_stream)  # RAW: read what was written
        return self.worker.launch(scheduled.step)

    def barrier(self) -> str:
        """WAR fence for the scheduler's next writes (sglang's ``_apply_war_barrier``); returns
        which fence it took."""
        owner = self.worker.mailbox
        event = owner.mailbox.take() if owner is not None else None
        fence = self.config.fence
        if fence == "none":
            kind = "none"
        elif fence == "fine" and event is not None and not self.pm.config.force_coarse:
            # Force-coarse is read at every barrier, as sglang does: switching it on while
            # running takes effect at the next barrier, before any cached decision is redone.
            self.schedule_stream.wait_event(event)
            kind = "fine"
        else:
            self.schedule_stream.wait_stream(self.forward_stream)
            kind = "coarse"
        self.barriers[kind] += 1
        return kind

    # -- the loop -------------------------------------------------------------------------
    def run(
        self,
        requests: list[Request],
        progress: Callable[[int, int], None] | None = None,
        observer: EngineObserver | None = None,
    ) -> RunReport:
        if observer is None:
            return self._run(requests, progress, _NO_OBSERVER)
        self.device.set_span_sink(observer.device_span)
        for runner in self.runners:
            runner.on_forward = _forward_hook(observer)
        try:
            return self._run(requests, progress, observer)
        finally:
            self.device.set_span_sink(None)
            for runner in self.runners:
                runner.on_forward = None

    def _run(
        self,
        requests: list[Request],
        progress: Callable[[int, int], None] | None,
        obs: EngineObserver,
    ) -> RunReport:
        if self.failure is not None:
            raise EngineFailed(
                f"this engine stopped after a device fault ({self.failure}); device errors are "
                "sticky, as on a GPU: build a new Engine"
            )
        reqs = [r.fresh() for r in requests]
        sched = Scheduler(
            reqs,
            self.pool,
            self.device,
            self.schedule_stream,
            self.config.scheduler,
            num_draft=self.num_draft,
            work_s=self.config.schedule_work_s,
        )
        for runner in self.runners:
            runner.published.clear()
        self.barriers.clear()
        stats = _Collected(sum(r.max_new_tokens for r in reqs), progress)
        start = time.perf_counter()
        stopped = None
        try:
            self._loop(sched, stats, obs)
            self.device.synchronize()
        except DeviceError as exc:
            # A device fault is sticky: nothing launched after it runs, and every event still
            # completes, so no wait hangs. Stop here; finished requests keep their tokens.
            self.failure = exc
            stopped = str(exc)
            for req in reqs:
                if not req.done:
                    req.error = f"engine stopped: {exc}"
        elapsed = time.perf_counter() - start
        stats.report_progress()
        published: Counter[tuple[ForwardMode, RecordPoint]] = Counter()
        for runner in self.runners:
            published.update(runner.published)
        return RunReport(
            config=self.config,
            device=self.device.name,
            requests=len(reqs),
            tokens=sum(len(r.output) for r in reqs),
            elapsed_s=elapsed,
            steps=stats.steps,
            forwards=stats.forwards,
            published=published,
            barriers=Counter(self.barriers),
            outputs={r.rid: list(r.output) for r in reqs},
            errors={r.rid: r.error for r in reqs if r.error is not None},
            rows_reused=sched.rows_reused,
            verifies=stats.verifies,
            accepted_drafts=stats.accepted,
            stopped=stopped,
        )

    def _loop(self, sched: Scheduler, stats: _Collected, obs: EngineObserver) -> None:
        clock = time.perf_counter
        serial = self.config.loop == "serial"
        pending: tuple[Scheduled, StepOutput] | None = None
        while not sched.finished_scheduling:
            t0 = clock()
            scheduled = sched.schedule(stats.steps)
            obs.host_span("schedule", t0, clock(), {"step": stats.steps})
            if scheduled is None:
                if pending is not None:
                    t0 = clock()
                    stats.collect(sched, *pending)
                    obs.host_span("collect", t0, clock(), {})
                    pending = None
                    stats.steps += 1
                    continue
                nxt = sched.next_arrival()
                stats.steps = max(stats.steps + 1, nxt if nxt is not None else 0)
                continue
            t0 = clock()
            out = self.launch(scheduled)
            sched.on_launched(scheduled)
            mode = scheduled.step.forward_mode
            obs.host_span("launch", t0, clock(), {"step": stats.steps, "mode": mode.name})
            stats.forwards[mode] += 1
            if serial:
                t0 = clock()
                self.device.synchronize()
                stats.collect(sched, scheduled, out)
                obs.host_span("collect", t0, clock(), {})
            else:
                t0 = clock()
                kind = self.barrier()
                obs.barrier(kind, t0)
                if pending is not None:
                    t0 = clock()
                    stats.collect(sched, *pending)
                    obs.host_span("collect", t0, clock(), {})
                pending = (scheduled, out)
            stats.report_progress()
            stats.steps += 1
        if pending is not None:
            stats.collect(sched, *pending)


_NO_OBSERVER = EngineObserver()


def _forward_hook(observer: EngineObserver) -> Callable[[str, ForwardMode, RecordPoint], None]:
    def hook(runner: str, mode: ForwardMode, point: RecordPoint) -> None:
        observer.forward(runner, mode, point, time.perf_counter())

    return hook


class _Collected:
    """The host side of results: append each request's accepted tokens, count steps,
    forwards and acceptance."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None) -> None:
        self.total = total
        self.progress = progress
        self.tokens = 0
        self.steps = 0
        self.forwards: Counter[ForwardMode] = Counter()
        self.verifies = 0
        self.accepted = 0

    def report_progress(self) -> None:
        if self.progress is not None:
            self.progress(self.tokens, self.total)

    def collect(self, sched: Scheduler, scheduled: Scheduled, out: StepOutput) -> None:
        tokens, sample = out.result()  # the host waits for this forward only
        prefill = scheduled.step.prompt_ids is not None
        verify = scheduled.step.forward_mode is ForwardMode.TARGET_VERIFY
        for i, req in enumerate(scheduled.requests):
            s = sample[i]
            new = [tokens[i][s]] if prefill else tokens[i][: s + 1]
            room = req.max_new_tokens - len(req.output)
            req.output.extend(new[:room])
            self.tokens += min(len(new), room)
            if verify and room > 0:
                self.verifies += 1
                self.accepted += s
            sched.on_collected(req)
