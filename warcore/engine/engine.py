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

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from warcore.attention import AttentionBackend
from warcore.batch import HostStaging, KVPool, RowState, staging_depth
from warcore.core import (
    NUM_DRAFT,
    AlgorithmSpec,
    BoundaryContext,
    ForwardMode,
    Phase,
    RecordPoint,
    SharedReadBoundary,
    StepSpec,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
    get_registry,
    latest,
)
from warcore.device import (
    Device,
    DeviceError,
    Event,
    EventRing,
    ForwardId,
    WaitBinding,
    get_device,
    records_in_flight,
)
from warcore.engine.config import EngineConfig
from warcore.engine.drafter import AlgorithmFactoryError, DrafterError, as_drafter
from warcore.engine.hicache import HostKVTier
from warcore.engine.model import TinyLlama
from warcore.engine.observe import EngineObserver
from warcore.engine.report import RunReport
from warcore.engine.requests import Request
from warcore.engine.scheduler import Scheduled, Scheduler
from warcore.engine.spec import StepWorker, Worker, build_drafter
from warcore.engine.steps import engine_problem, records_per_step, step_of
from warcore.runners import ModelRunner, RunnerGroup, StepOutput

__all__ = ["Engine", "EngineBusy", "EngineFailed"]

Launched = tuple[Scheduled, StepOutput]
"""A launched step: the scheduler's batch, and the output its forwards will leave."""


class EngineFailed(RuntimeError):
    """The engine was asked to run after a device fault stopped it."""


class EngineBusy(RuntimeError):
    """The engine was asked to run while a run of it was in progress (another thread's, or a
    callback of the run itself): one engine serves one run at a time."""


class Engine:
    """The reference overlap engine (see the module docstring).

    Construction builds the model, the pools, the runners and captures their graphs; if any of
    that fails, what was built is released before the error propagates: the device, when the
    engine created it (a device passed in stays the caller's to close), and the decision-cache
    entries of the backends built so far. Nothing of a failed construction stays alive.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        device: Device | str | None = None,
        pm: WarcorePluginManager | None = None,
    ) -> None:
        self._built_backends: list[object] = []
        self._running = threading.Lock()
        """Held for a whole run: two runs of one engine would share its streams, pools and rows,
        and each would return the other's tokens without an error."""
        try:
            self._construct(config, device=device, pm=pm)
        except BaseException:
            self._release_partial(owns_device=not isinstance(device, Device))
            raise

    def _release_partial(self, *, owns_device: bool) -> None:
        """After a failed construction: forget the cache entries of the backends built and
        close the device (its stream workers and captured graphs) if this engine made it."""
        pm = self.__dict__.get("pm")
        if pm is not None and self._built_backends:
            get_decision_cache(pm).forget(self._built_backends)  # the runners' cache
        dev = self.__dict__.get("device")
        if owns_device and isinstance(dev, Device):
            dev.close()

    def _construct(
        self,
        config: EngineConfig | None,
        *,
        device: Device | str | None,
        pm: WarcorePluginManager | None,
    ) -> None:
        self.config = cfg = config or EngineConfig()
        self.pm = pm if pm is not None else get_plugin_manager()
        algorithm = self._resolve(cfg)
        self.device = device if isinstance(device, Device) else get_device(device)
        self._build_model(cfg)
        self.target = self._group(
            "target",
            self.model,
            self.pool,
            self.backend_spec.factory,
            {
                ForwardMode.TARGET_VERIFY if self.num_draft else ForwardMode.DECODE: self.num_draft
                + 1
            },
        )
        self.runner = self.target.runner
        self.step_worker = self._step_worker(algorithm, self.backend_spec.factory)
        self.worker: Worker = self.step_worker
        """What the loop launches: the step worker, or an audit tool's wrapper around it."""
        self._init_run_state(cfg)
        self._build_rings()
        # Capture's warm-up forwards are queued on the forward stream: finish them here, so a
        # run's time is the run's, and a fault during capture surfaces at construction.
        self.device.synchronize()

    def _resolve(self, cfg: EngineConfig) -> AlgorithmSpec:
        """The configuration against the registry: the algorithm, the backend, the flags (only
        declared ones, each of its kind: a misspelt flag would read as its default), the step;
        an algorithm the reference engine cannot run, or a speculation it has no room for, is
        refused naming it."""
        registry = get_registry(self.pm)
        algorithm = registry.algorithm(cfg.algorithm)  # unknown names list the valid ones
        self.backend_spec = registry.backend(cfg.backend)
        self.flags = registry.check_flags(cfg.flags)
        self.family = algorithm.family
        problem = engine_problem(algorithm)
        if problem is not None:
            raise ValueError(
                f"algorithm {cfg.algorithm!r} cannot run on the reference engine: {problem}"
            )
        step = step_of(algorithm)
        assert step is not None  # engine_problem() says why when there is none
        room = cfg.speculation_problem() if step.speculative else None
        if room is not None:
            raise ValueError(room)
        self.step: StepSpec = step
        """The algorithm's step, as the worker runs it."""
        self.num_draft = cfg.num_draft if step.speculative else 0
        self.context = BoundaryContext(cfg.algorithm, self.flags)
        return algorithm

    def _build_model(self, cfg: EngineConfig) -> None:
        """The model, the KV pool and its tables, the rows, the two streams."""
        tdev = self.device.torch_device
        self.capacity = cfg.token_capacity
        self.model = TinyLlama(cfg.model, tdev)
        max_reqs = cfg.scheduler.max_running + 1
        self.pool = KVPool(cfg.model, tdev, max_reqs=max_reqs, num_slots=cfg.num_slots)
        self.rows = RowState(
            tdev, self.pool.max_reqs, cfg.model.hidden, cfg.model.dtype, self.num_draft
        )
        self.forward_stream = self.device.new_stream("forward")
        self.schedule_stream = self.device.new_stream("schedule")

    def _init_run_state(self, cfg: EngineConfig) -> None:
        self.barriers: Counter[str] = Counter()
        self.bindings: list[WaitBinding] = []
        """Every wait on a read-done event in the run (the barrier's, the copy consumer's):
        the forward it meant and the record it bound to (see :mod:`warcore.audit.bindings`)."""
        self.copy_stream = self.device.new_stream("copy") if cfg.copy_wait != "none" else None
        self.tier: HostKVTier | None = None
        """The host KV tier, when the ``hicache`` flag is on (see :mod:`warcore.engine.hicache`)."""
        if self.context.flag("hicache"):
            self.tier = HostKVTier(
                self.pool,
                self.device,
                self.device.new_stream("hicache"),
                host_tokens=cfg.hicache_host_tokens,
                block=cfg.hicache_block,
                deferred_free=cfg.hicache_deferred_free,
            )
        self._deferred: tuple[Event, ForwardId | None] | None = None
        self._launches = 0
        self._observer: EngineObserver = _NO_OBSERVER
        self.failure: DeviceError | None = None
        self._scheduler: Scheduler | None = None
        """The scheduler of the run in progress (the rows it released, for the drafter)."""

    def _build_rings(self) -> None:
        """Give each runner a ring as deep as the records it can have in flight: the barrier
        waits right after the step it means; ``after-next-launch`` waits one step later, while
        the runner issues up to its forwards-per-step more records. A configured depth below
        that is refused, naming the runner and the depth it needs."""
        for runner in self.runners:
            depth, needed = self._ring_depth(runner.name)
            runner.ring = EventRing(self.device, depth, f"runner {runner.name!r}", needed=needed)

    def _ring_depth(self, runner: str) -> tuple[int, int]:
        """(depth, needed) of ``runner``'s rings: its event ring's and, with
        ``in_graph_event="ring"``, its graphs' ring of captured record nodes."""
        lag = 1 if self.config.copy_wait == "after-next-launch" else 0
        needed = records_in_flight(records_per_step(self.step, runner, self.num_draft), lag)
        return self.config.event_ring_depth or needed, needed

    def _step_worker(self, algorithm: AlgorithmSpec, factory: Callable[..., object]) -> StepWorker:
        """The generic worker for the algorithm's step, with the draft model's runner group and
        the proposing drafter the step needs, each built by the algorithm's drafter factory."""
        cfg, step, tdev = self.config, self.step, self.device.torch_device
        width = self.num_draft + 1
        name = cfg.algorithm
        owner = f"algorithm {name!r} ({_plugin_of(self.pm, name)})"
        for phase in step.decode:
            chain = phase.runner == "draft" and phase.mode is ForwardMode.DECODE
            if chain and phase.repeat != NUM_DRAFT and phase.repeat != self.num_draft:
                raise ValueError(
                    f"algorithm {name!r}: its draft chain runs {phase.repeat} steps, but the "
                    f"engine verifies num_draft={width - 1} drafts; use repeat='num_draft'"
                )
        draft = drafter = None
        if step.has_draft_model:
            draft_model = build_drafter(algorithm.drafter, owner, self.model, self.num_draft, tdev)
            if not isinstance(draft_model, TinyLlama):
                raise DrafterError(
                    f"{owner}: its step runs a draft model, but its drafter factory "
                    f"returned {draft_model!r}, not a warcore.engine.model.TinyLlama"
                )
            draft_pool = KVPool(
                draft_model.cfg,
                tdev,
                max_reqs=self.pool.max_reqs,
                num_slots=cfg.num_slots,
                share_tables_with=self.pool,
            )
            modes = {
                p.mode: 1 if p.mode is ForwardMode.DECODE else width
                for p in step.decode
                if p.runner == "draft"
            }
            draft = self._group("draft", draft_model, draft_pool, factory, modes)
        if step.propose:
            made = build_drafter(algorithm.drafter, owner, self.model, self.num_draft, tdev)
            drafter = as_drafter(made, owner)
        worker = StepWorker(
            name,
            step,
            self.target,
            num_draft=self.num_draft,
            draft=draft,
            drafter=drafter,
            max_context=self.pool.max_context,
            owner=owner,
        )
        self._install_stager(algorithm, worker, owner)
        return worker

    def _install_stager(self, algorithm: AlgorithmSpec, worker: StepWorker, owner: str) -> None:
        """Give the target's prefill runner the algorithm's per-batch stager (stage, then
        publish), where its step reads later and staging is on; a factory that raises or
        returns no callable is an :class:`AlgorithmFactoryError` here, naming the algorithm."""
        factory = algorithm.prefill_shared_read_stager
        if factory is None or not self.config.prefill_staging or not self.step.prefill_reads_later:
            return
        try:
            stager = factory(worker)
        except Exception as exc:
            raise AlgorithmFactoryError(
                f"{owner}: its prefill_shared_read_stager factory raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not callable(stager):
            raise AlgorithmFactoryError(
                f"{owner}: its prefill_shared_read_stager factory returned {stager!r}, not a "
                "callable stager(forward_batch) -> bool"
            )
        runner = self.target.runner
        runner.prefill_shared_read_stager = stager
        runner.stager_owner = owner

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
        self._built_backends.append(backend)
        if not isinstance(backend, AttentionBackend) or backend.name != cfg.backend:
            raise TypeError(
                f"backend factory for {cfg.backend!r} returned {backend!r}; expected an "
                f"AttentionBackend named {cfg.backend!r}"
            )
        runner = ModelRunner(
            staging=self._staging(name),
            host_reads=self._host_reads(backend),
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
        # The persistent in-graph event is the ring of depth 1 (nothing is refused for it: the
        # binding audit reports a consumer that waits too late).
        depth, needed = self._ring_depth(name) if cfg.in_graph_event == "ring" else (1, 1)
        return RunnerGroup(
            runner,
            graph_modes,
            use_graphs=cfg.use_graphs,
            plant_node=cfg.plant_node,
            node_ring_depth=depth,
            node_ring_needed=needed,
        )

    def _host_reads(self, backend: AttentionBackend) -> dict[ForwardMode, SharedReadBoundary]:
        """Until when the backend's kernels read staged host buffers, per mode: the latest of
        what its class and its spec declare (a bad class declaration is refused here, naming
        the backend, before anything runs)."""
        reads = dict(backend.host_read_items())
        for mode, until in self.backend_spec.host_read_items():
            reads[mode] = latest(reads.get(mode, until), until)
        return reads

    def _staging(self, runner: str) -> HostStaging:
        """The host staging ring of ``runner``: deep enough for the forwards this runner
        launches in a step, with one step in flight (the overlap loop's), plus those it
        launches after the target's last forward: the host collects a step by the target's
        output, so they may still be running when the step after next is staged."""
        cfg, step = self.config, self.step

        def forwards(phases: tuple[Phase, ...]) -> int:
            return sum(
                self.num_draft if p.repeat == NUM_DRAFT else int(p.repeat)
                for p in phases
                if p.runner == runner
            )

        def after_target(phases: tuple[Phase, ...]) -> int:
            last = max(i for i, p in enumerate(phases) if p.runner == "target")
            return forwards(phases[last + 1 :])

        required = staging_depth(
            max(1, forwards(step.decode), forwards(step.prefill)),
            after_collect=max(after_target(step.decode), after_target(step.prefill)),
        )
        return HostStaging(
            cfg.scheduler.max_running,
            self.capacity,
            cfg.staging_depth or required,
            pin=self.device.name == "cuda",
            guarded=cfg.staging_guard,
            required=required,
            fresh=cfg.staging == "fresh",
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
        tier = self.tier
        if tier is not None:
            # RAW on what the load-back wrote; WAR on the slots the offload still reads.
            self.forward_stream.wait_stream(tier.stream)
        self._release_rows()
        step = replace(scheduled.step, request_ids=tuple(r.rid for r in scheduled.requests))
        self._launches += 1
        for runner in self.runners:
            runner.step_index = self._launches
        out = self.worker.launch(step)
        if tier is not None:
            tier.launched(self._launches, self.forward_stream.record_event())
        self._copy_wait_deferred()
        return out

    def _release_rows(self) -> None:
        """Tell the worker (its drafter) which admitted rows the scheduler released since the
        last launch: in stream order, before the next step's work."""
        sched = self._scheduler
        if sched is None or not self.step_worker.admitted:
            return
        live = {(r.row, r.rid) for r in sched.running}
        gone = [row for row, rid in self.step_worker.admitted.items() if (row, rid) not in live]
        if gone:
            self.step_worker.release(gone)

    def barrier(self) -> str:
        """WAR fence for the scheduler's next writes (sglang's ``_apply_war_barrier``); returns
        which fence it took."""
        owner = self.worker.mailbox
        event, meant = owner.mailbox.take_published() if owner is not None else (None, None)
        if owner is not None and owner.forward is not None:
            # The barrier means the owner's latest forward (the step's last reader), whoever
            # left the event: a stale event left by an earlier forward binds early.
            meant = owner.forward
        fence = self.config.fence
        if fence == "none":
            kind = "none"
        elif fence == "fine" and event is not None and not self.pm.config.force_coarse:
            # Force-coarse is read at every barrier, as sglang does: switching it on while
            # running takes effect at the next barrier, before any cached decision is redone.
            self._bound(WaitBinding("barrier", meant, self.schedule_stream.wait_event(event)))
            kind = "fine"
        else:
            self.schedule_stream.wait_stream(self.forward_stream)
            kind = "coarse"
        self.barriers[kind] += 1
        if self.tier is not None and kind != "none":
            self.tier.fenced(self._launches, whole=kind == "coarse")
        if event is not None and self.copy_stream is not None:
            if self.config.copy_wait == "at-barrier":
                self._copy_wait(event, meant)
            else:  # after-next-launch: sglang #31072's copy-side wait
                self._deferred = (event, meant)
        return kind

    def _bound(self, binding: WaitBinding) -> None:
        self.bindings.append(binding)
        if self._observer is not _NO_OBSERVER:
            self._observer.binding(binding, time.perf_counter())

    def _copy_wait_deferred(self) -> None:
        if self._deferred is not None:
            event, meant = self._deferred
            self._deferred = None
            self._copy_wait(event, meant)

    def _copy_wait(self, event: Event, meant: ForwardId | None) -> None:
        """The copy consumer: its stream waits on the event, then copies (a no-op here)."""
        assert self.copy_stream is not None
        self._bound(WaitBinding("copy", meant, self.copy_stream.wait_event(event)))
        with self.device.use_stream(self.copy_stream):
            self.device.launch(_copy_out, "copy_out")

    # -- the loop -------------------------------------------------------------------------
    def run(
        self,
        requests: list[Request],
        progress: Callable[[int, int], None] | None = None,
        observer: EngineObserver | None = None,
    ) -> RunReport:
        """Serve ``requests`` (copies: the list is not changed) and report.

        A request this engine cannot serve (a token id outside ``0..vocab_size - 1``, a prompt
        longer than ``max_prompt``, more KV positions than a request may have) is not served:
        the report has ``errors[rid]`` saying why (naming the value and the limit) and an empty
        output, and every other request is served. Two requests with the same ``rid`` raise
        :class:`ValueError` naming it before anything runs: outputs and errors are keyed by
        ``rid``, so serving both would lose one of them. A run while another run of this engine
        is in progress (another thread's) raises :class:`EngineBusy` at once, changing nothing.
        """
        _check_request_ids(requests)
        if not self._running.acquire(blocking=False):
            raise EngineBusy(
                "this engine is already running (another thread's run, or a callback of the "
                "run): one engine serves one run at a time; wait for it, or build an Engine "
                "per thread"
            )
        try:
            return self._observed_run(requests, progress, observer)
        finally:
            self._running.release()

    def _observed_run(
        self,
        requests: list[Request],
        progress: Callable[[int, int], None] | None,
        observer: EngineObserver | None,
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
        servable = self._servable(reqs)
        sched = Scheduler(
            servable,
            self.pool,
            self.device,
            self.schedule_stream,
            self.config.scheduler,
            num_draft=self.num_draft,
            work_s=self.config.schedule_work_s,
            tier=self.tier,
        )
        if self.tier is not None:
            self.tier.reset()
        for runner in self.runners:
            runner.published.clear()
            runner.staging.stalls = 0
            runner.stager_raised = {}
            runner.staged_prefills = 0
        self.step_worker.prefill_staged = False
        self.barriers.clear()
        self.bindings.clear()
        self._observer = obs
        self._deferred = None
        self._launches = 0
        stats = _Collected(sum(r.max_new_tokens for r in servable), progress)
        start = time.perf_counter()
        stopped, drafter_problems = self._serve(sched, stats, obs, reqs)
        elapsed = time.perf_counter() - start
        stats.report_progress()
        return self._report(reqs, sched, stats, elapsed, stopped, drafter_problems)

    def _servable(self, reqs: list[Request]) -> list[Request]:
        """The requests this engine can serve; each other one gets ``error`` saying why."""
        cfg = self.config
        max_kv = min(self.pool.max_context, self.pool.num_slots - 1)
        for req in reqs:
            req.error = req.problem(
                vocab_size=cfg.model.vocab_size,
                max_prompt=cfg.max_prompt,
                max_kv=max_kv,
                num_draft=self.num_draft,
            )
        return [r for r in reqs if r.error is None]

    def _serve(
        self, sched: Scheduler, stats: _Collected, obs: EngineObserver, reqs: list[Request]
    ) -> tuple[str | None, list[str]]:
        """Run the loop to its end: the device fault that stopped it (``None``: none), and how
        the algorithm's drafter broke its contract (each problem also logged once)."""
        worker = self.step_worker
        worker.release_all()  # rows a stopped earlier run left admitted
        worker.reset_problems()
        self._scheduler = sched
        try:
            self._loop(sched, stats, obs)
            worker.release_all()
            self.device.synchronize()
            problems = worker.drafter_problems()
            for kind, problem in problems.items():
                self.pm.log_once(("drafter", worker.owner, kind), logging.WARNING, problem)
            return None, list(problems.values())
        except DeviceError as exc:
            # A device fault is sticky: nothing launched after it runs, and every event still
            # completes, so no wait hangs. Stop here; finished requests keep their tokens.
            self.failure = exc
            for req in reqs:
                if not req.done:
                    req.error = f"engine stopped: {exc}"
            return str(exc), []

    def _report(
        self,
        reqs: list[Request],
        sched: Scheduler,
        stats: _Collected,
        elapsed: float,
        stopped: str | None,
        drafter_problems: list[str],
    ) -> RunReport:
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
            drafter_problems=drafter_problems,
            stager_problems=self._stager_problems(),
            staged_prefills=self.target.runner.staged_prefills,
            bindings=list(self.bindings),
            prefix_cache=None if self.tier is None else replace(self.tier.stats),
            staging_stalls=sum(r.staging.stalls for r in self.runners),
        )

    def _stager_problems(self) -> list[str]:
        problems = self.target.runner.stager_problems()
        for problem in problems:
            self.pm.log_once(("stager", problem.split(":")[0]), logging.WARNING, problem)
        return problems

    def _loop(self, sched: Scheduler, stats: _Collected, obs: EngineObserver) -> None:
        """Step after step until every request is served: schedule step N+1 and launch it,
        fence the scheduler's next writes, then collect step N, which ran meanwhile. The
        serial loop collects each step right after launching it instead."""
        serial = self.config.loop == "serial"
        in_flight: Launched | None = None
        while not sched.finished_scheduling:
            scheduled = self._schedule(sched, stats, obs)
            if scheduled is None:  # nothing can launch at this step
                if in_flight is not None:
                    self._collect(sched, stats, obs, in_flight)
                    in_flight = None
                    stats.steps += 1
                else:  # idle until the next request arrives
                    arrival = sched.next_arrival()
                    stats.steps = max(stats.steps + 1, arrival if arrival is not None else 0)
                continue
            launched = self._launch_step(sched, stats, obs, scheduled)
            if serial:
                self._collect(sched, stats, obs, launched, wait_all=True)
            else:
                t0 = time.perf_counter()
                obs.barrier(self.barrier(), t0)
                if in_flight is not None:
                    self._collect(sched, stats, obs, in_flight)
                in_flight = launched
            stats.report_progress()
            stats.steps += 1
        self._copy_wait_deferred()
        if in_flight is not None:
            stats.collect(sched, *in_flight)

    def _schedule(
        self, sched: Scheduler, stats: _Collected, obs: EngineObserver
    ) -> Scheduled | None:
        t0 = time.perf_counter()
        scheduled = sched.schedule(stats.steps)
        obs.host_span("schedule", t0, time.perf_counter(), {"step": stats.steps})
        return scheduled

    def _launch_step(
        self, sched: Scheduler, stats: _Collected, obs: EngineObserver, scheduled: Scheduled
    ) -> Launched:
        t0 = time.perf_counter()
        out = self.launch(scheduled)
        sched.on_launched(scheduled)
        mode = scheduled.step.forward_mode
        obs.host_span("launch", t0, time.perf_counter(), {"step": stats.steps, "mode": mode.name})
        stats.forwards[mode] += 1
        return scheduled, out

    def _collect(
        self,
        sched: Scheduler,
        stats: _Collected,
        obs: EngineObserver,
        launched: Launched,
        *,
        wait_all: bool = False,
    ) -> None:
        """The host side of a launched step: wait for it (``wait_all``: for all device work),
        then hand its tokens to the requests."""
        t0 = time.perf_counter()
        if wait_all:
            self.device.synchronize()
            if self.tier is not None:  # the host waited for everything launched
                self.tier.fenced(self._launches, whole=True)
        stats.collect(sched, *launched)
        obs.host_span("collect", t0, time.perf_counter(), {})


_NO_OBSERVER = EngineObserver()


def _copy_out() -> None:
    """The copy consumer's work after its wait (a real engine copies KV out here)."""


def _plugin_of(pm: WarcorePluginManager, algorithm: str) -> str:
    """``plugin 'dflash' (warcore-dflash)``: who offers ``algorithm``."""
    offer = get_registry(pm).algorithms.get(algorithm)
    plugin = offer.plugin if offer is not None else "?"
    dist = next((i.distribution for i in pm.plugin_infos if i.name == plugin), None)
    return f"plugin {plugin!r}" + (f" ({dist})" if dist else "")


def _check_request_ids(requests: list[Request]) -> None:
    seen: dict[int, int] = {}
    for i, req in enumerate(requests):
        if not isinstance(req, Request):
            raise TypeError(f"requests[{i}] is {req!r}, not a warcore.engine.Request")
        first = seen.setdefault(req.rid, i)
        if first != i:
            raise ValueError(
                f"duplicate request id {req.rid!r} (requests[{first}] and requests[{i}]): "
                "outputs and errors are keyed by id, so one would be lost; give each request "
                "its own rid"
            )


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
