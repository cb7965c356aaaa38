"""The WAR sanitizer: a mechanical check that no shared read happens after the read-done point.

A declaration is only as good as somebody's reading of a backend's code. The sanitizer checks
what the code does. It serves one request trace twice with the reference engine's serial loop
(deterministic: one step at a time, the scheduler never writes while a step runs):

1. a *clean* run, which records every forward's outputs and, per step, which forward's
   read-done event the scheduler's barrier takes (the last forward of the worker's mailbox
   runner, when it publishes);
2. a *poisoned* run of the same trace: before each step the scheduler-shared buffers are
   snapshotted; at the record point of that forward they are overwritten with poison (valid
   but wrong slot indices), exactly in stream order: on the forward stream after
   ``load_batch`` (``PRE_REPLAY``), after the in-graph init (eager), at the in-graph node
   (inside a probe graph captured with the poison right after the planted node) or after the
   replay; after the step they are restored.

Every forward's outputs (sampled tokens, last hidden states, accepted counts), and the row state
each step leaves for the next (committed lengths, next tokens, features, drafts), are compared
bit for bit. Equal everywhere: nothing read the shared buffers after a read-done point, so an
overlap scheduler could have rewritten them there. The first difference is a violation,
reported with the backend, the forward mode, the algorithm, the declared boundary, the record
point and the differing output; the poisoned run stops there (past it the runs are no longer
comparable).

The poison lasts to the end of the *step*, not just the publishing forward: the event tells the
scheduler that the whole step is done reading, so a later forward of the step that reads the
shared buffers (an algorithm whose publish phase is not its last reader, a drafter that reads
``req_to_token``) is caught too. Forwards of steps whose barrier gets no event
(``RecordPoint.NONE``: the coarse fence) are compared but never poisoned: there is nothing to
check, and the report counts them apart. An event that no barrier takes (a runner that is not
the mailbox) fences nothing, so it is not checked either.

The runs are separate engines, rather than one forward run twice, so that nothing the poisoned
forward wrote (KV at a poisoned address, say) can leak into the comparison.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, TypedDict, get_args

import torch

from warcore.audit._poison import SharedBufferPoison
from warcore.audit._sanitize_probe import (
    ROW_STATE,
    Diverged,
    SanitizerProbe,
    SanitizingWorker,
    StepState,
    barrier_sources,
    mark_poisoned,
)
from warcore.audit.bindings import BindingFinding, audit_bindings, binding_summary
from warcore.core import (
    Decision,
    DecisionCache,
    DecisionKey,
    Execution,
    FlagValue,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    WarcorePluginManager,
    decide,
    get_plugin_manager,
    get_registry,
)
from warcore.device import WaitBinding
from warcore.engine.steps import engine_problem

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from warcore.audit._sanitize_probe import ForwardRecord
    from warcore.engine import Engine, EngineConfig, ModelConfig, Request
    from warcore.engine.config import CopyWait, InGraphEvent
    from warcore.runners import RunnerGroup

__all__ = [
    "DEFAULT_REQUESTS",
    "Combination",
    "EngineOptions",
    "ModeSummary",
    "SanitizeReport",
    "VIOLATION_KINDS",
    "SglangFallbackDecisions",
    "Violation",
    "ViolationKind",
    "combinations",
    "engine_config",
    "sanitize",
    "trace_for",
]

DEFAULT_REQUESTS = 10
"""Requests in the default trace: enough for prefills, decodes and batches of several sizes,
few enough that a whole matrix runs in seconds."""

ViolationKind = Literal["late-read", "later-forward", "later-work", "poisoned-state"]
"""The sanitizer's verdicts for a violation, as it prints them (``VIOLATION (later-work)``)
and as the README's table names them (a test ties the two)."""
VIOLATION_KINDS: tuple[ViolationKind, ...] = get_args(ViolationKind)


class SglangFallbackDecisions(DecisionCache):
    """Decisions as sglang #34052 made them, for audits: a captured graph without a planted
    node records an ``IN_REPLAY`` declaration *before* the replay (``PRE_REPLAY``) in the
    decode runner, and publishes nothing in the draft-extend runner. warcore's own rule records
    after the replay instead; install this on the runners to see why (the sanitizer's
    ``sglang_fallback`` option)."""

    def resolve(self, key: DecisionKey) -> Decision:
        decision = decide(self.pm, *key)
        kind, execution = key[0], key[4]
        if (
            execution is Execution.GRAPH_UNPLANTED
            and decision.declared.boundary is SharedReadBoundary.IN_REPLAY
            and decision.record_point is RecordPoint.POST_REPLAY
        ):
            legacy = RecordPoint.PRE_REPLAY if kind is RunnerKind.DECODE else RecordPoint.NONE
            decision = replace(decision, record_point=legacy)
        return decision


@dataclass(frozen=True)
class Violation:
    """The first output that differed between the poisoned and the clean run."""

    backend: str
    algorithm: str
    kind: ViolationKind
    """``late-read``: the publishing forward itself read after its record point;
    ``later-forward``: a later forward of the same step read the poisoned buffers (the
    algorithm's publish phase is not the step's last reader); ``later-work``: every forward
    matched but the row state the step left differs (work after the forwards, a drafter say,
    read them); ``poisoned-state``: something outside any poisoned window differed because
    earlier poisoned work wrote state through a poisoned read."""
    step: int
    forward: int
    runner: str
    forward_mode: ForwardMode
    """The forward whose outputs differed."""
    published_by: str
    published_mode: ForwardMode
    declared: SharedReadBoundary
    declared_by: str
    record_point: RecordPoint
    """The declaration and record point of the forward whose read-done started the poison."""
    difference: str

    def describe(self) -> str:
        where = (
            f"{self.published_by} declared {self.declared.name} ({self.declared_by}) and "
            f"recorded its read-done at {self.record_point.value} in step {self.step}"
        )
        if self.kind == "late-read":
            what = "but read scheduler-shared buffers after that point"
        elif self.kind == "later-forward":
            what = (
                f"but a later forward of the same step, {self.runner} "
                f"{self.forward_mode.name}, read scheduler-shared buffers (the algorithm's "
                "publish phase is not the step's last reader)"
            )
        elif self.kind == "later-work":
            what = (
                "but work later in the step, after its forwards (a drafter, the commit), read "
                "scheduler-shared buffers"
            )
        else:
            what = (
                f"and a poisoned read wrote state that {self.runner} {self.forward_mode.name} "
                f"(forward {self.forward}, step {self.step}) later read"
            )
        return (
            f"VIOLATION ({self.kind}) backend {self.backend!r}, algorithm {self.algorithm!r}: "
            f"{where}, {what}; first differing output: {self.difference}"
        )


@dataclass
class ModeSummary:
    """What the sanitizer saw of one runner's forwards of one mode."""

    runner: str
    mode: ForwardMode
    declared: SharedReadBoundary
    declared_by: str
    record_points: Counter[RecordPoint] = field(default_factory=Counter)
    because: str = ""
    """Why the runner records where it does (the decision's provenance)."""
    forwards: int = 0
    checked: int = 0
    """Forwards that ran with poisoned buffers (from their record point, or entirely)."""

    @property
    def label(self) -> str:
        return f"{self.runner} {self.mode.name}"


@dataclass
class SanitizeReport:
    backend: str
    algorithm: str
    device: str
    requests: int
    flags: tuple[tuple[str, FlagValue], ...] = ()
    modes: list[ModeSummary] = field(default_factory=list)
    forwards: int = 0
    checked: int = 0
    compared: int = 0
    """Forwards compared before the first difference (all of them when sound)."""
    violation: Violation | None = None
    error: str | None = None
    """The engine could not be run or compared (not a violation): the message."""
    skipped: str | None = None
    """The combination cannot run here (a CUDA-only backend on sim): why."""
    elapsed_s: float = 0.0
    """Everything: both engines built and run, and the comparison."""
    run_s: dict[str, float] = field(default_factory=dict)
    """``engine.run`` alone, per run (``clean``, ``poisoned``, ``bindings``)."""
    bindings: str = ""
    """The binding run's waits by consumer and verdict (``barrier 41 bound``); empty: not
    run."""
    binding_findings: list[BindingFinding] = field(default_factory=list)
    """Waits of the binding run bound to another forward's record (the binding audit)."""
    binding_log: list[WaitBinding] = field(default_factory=list)
    """Every wait of the binding run, in issue order (what ``--explain`` shows per step)."""

    @property
    def binding_violation(self) -> BindingFinding | None:
        """The first wait bound to an *earlier* forward's record (unsafe), if any."""
        return next((f for f in self.binding_findings if f.violation), None)

    @property
    def binding_warnings(self) -> list[BindingFinding]:
        """Waits bound to a *later* forward's record (a liveness hazard)."""
        return [f for f in self.binding_findings if not f.violation]

    @property
    def sound(self) -> bool:
        return self.violation is None and self.error is None and self.binding_violation is None

    @property
    def verdict(self) -> str:
        if self.skipped is not None:
            return "skipped"
        if self.error is not None:
            return "ERROR"
        if self.violation is not None:
            return f"VIOLATION ({self.violation.kind})"
        if self.binding_violation is not None:
            return "VIOLATION (early-binding)"
        warned = " with a late-binding WARNING" if self.binding_warnings else ""
        return ("sound" if self.checked else "sound (nothing published)") + warned

    def format(self) -> str:
        lines = [
            f"sanitize {self.backend} / {self.algorithm} on {self.device}: {self.verdict}; "
            f"{self.checked} of {self.forwards} forwards run with poisoned buffers "
            f"({self.requests} requests, {self.elapsed_s:.2f} s)"
        ]
        for m in self.modes:
            ordered = sorted(m.record_points.items(), key=_pv)
            points = ", ".join(f"{p.value} x{n}" for p, n in ordered)
            because = "" if m.because == m.declared_by else f" ({m.because})"
            lines.append(
                f"  {m.label:<22} declared {m.declared.name:<11} ({m.declared_by}); "
                f"record point {points}{because}; {m.checked}/{m.forwards} checked"
            )
        if self.bindings:
            lines.append(f"  bindings (overlap loop): {self.bindings}")
        lines += [f"  {f.describe()}" for f in self.binding_findings]
        if self.violation is not None:
            lines.append("  " + self.violation.describe())
        if self.error is not None:
            lines.append(f"  ERROR {self.error}")
        if self.skipped is not None:
            lines.append(f"  skipped: {self.skipped}")
        return "\n".join(lines)


def _pv(item: tuple[RecordPoint, int]) -> str:
    return item[0].value


# -- what to run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Combination:
    backend: str
    algorithm: str
    skipped: str | None = None


_CUDA_ONLY_BACKENDS = frozenset({"flashinfer"})
"""Backends whose kernels exist only on a GPU (they raise when built on sim)."""


ELSEWHERE = "not on this engine or device"
"""The start of a skip reason for a combination that runs only in another engine (sglang's
backends, declarations only) or on another device (flashinfer: CUDA only): ``sanitize --all``
states these and does not count them as unaudited."""


def combinations(
    pm: WarcorePluginManager,
    backends: Sequence[str] = (),
    algorithms: Sequence[str] = (),
    device: str = "sim",
) -> list[Combination]:
    """Every registered backend x algorithm the reference engine can run (narrowed to the
    names given), with a reason where one cannot run here. Unknown names raise
    :class:`~warcore.core.UnknownNameError` listing the valid ones."""
    registry = get_registry(pm)
    for name in backends:
        registry.backend(name)
    for name in algorithms:
        registry.algorithm(name)
    out: list[Combination] = []
    for backend in sorted(backends or registry.backends):
        for algorithm in sorted(algorithms or registry.algorithms):
            spec = registry.algorithm(algorithm)
            backend_engine = registry.backend(backend).engine
            # Why the reference engine cannot run the algorithm's step (issue 14), if it can't.
            reason = engine_problem(spec)
            if backend_engine != "warcore":
                reason = f"{ELSEWHERE} (backend {backend!r} runs in {backend_engine})"
            elif spec.engine != "warcore":
                reason = f"{ELSEWHERE} (algorithm {algorithm!r} runs in {spec.engine})"
            elif reason is not None:
                reason = f"not runnable: {reason}"
            elif backend in _CUDA_ONLY_BACKENDS and device != "cuda":
                reason = f"{ELSEWHERE} (backend {backend!r} runs on cuda only)"
            out.append(Combination(backend, algorithm, reason))
    return out


def trace_for(requests: int | Sequence[Request], seed: int = 0) -> list[Request]:
    """The trace the sanitizer serves: short outputs keep a run to a fraction of a second."""
    from warcore.engine import synthetic_trace

    if isinstance(requests, int):
        if requests < 1:
            raise ValueError(f"need at least one request, got {requests}")
        return synthetic_trace(requests, seed=seed, output_len=(2, 12))
    return list(requests)


class EngineOptions(TypedDict, total=False):
    """What :func:`engine_config` takes beyond the backend and algorithm: :func:`sanitize`
    passes them on, so their defaults are said once, in :func:`engine_config`."""

    flags: Mapping[str, FlagValue] | None
    use_graphs: bool
    plant_node: bool
    num_draft: int
    dtype: torch.dtype | None
    max_running: int
    model: ModelConfig | None
    in_graph_event: InGraphEvent


def engine_config(
    backend: str,
    algorithm: str = "none",
    *,
    flags: Mapping[str, FlagValue] | None = None,
    use_graphs: bool = True,
    plant_node: bool = True,
    num_draft: int = 4,
    dtype: torch.dtype | None = None,
    max_running: int = 8,
    model: ModelConfig | None = None,
    in_graph_event: InGraphEvent = "persistent",
) -> EngineConfig:
    """The engine configuration a sanitizer run uses: the serial loop, small pools; the
    reference model unless ``model`` says otherwise (``dtype`` overrides its dtype)."""
    from warcore.engine import EngineConfig, ModelConfig, SchedulerConfig

    if model is None:
        if dtype is None:
            # flashinfer's kernels need 16-bit weights; the comparison is run against run, so
            # the dtype changes nothing about what is checked.
            dtype = torch.float16 if backend in _CUDA_ONLY_BACKENDS else torch.float64
        model = ModelConfig(dtype=dtype)
    elif dtype is not None:
        model = replace(model, dtype=dtype)
    return EngineConfig(
        backend=backend,
        algorithm=algorithm,
        loop="serial",
        use_graphs=use_graphs,
        plant_node=plant_node,
        num_draft=num_draft,
        model=model,
        in_graph_event=in_graph_event,
        scheduler=SchedulerConfig(max_running=max_running),
        num_slots=1024,
        flags=tuple(sorted((flags or {}).items())),
    )


# -- running -------------------------------------------------------------------------------


def sanitize(
    backend: str,
    algorithm: str = "none",
    *,
    pm: WarcorePluginManager | None = None,
    device: str = "sim",
    requests: int | Sequence[Request] = DEFAULT_REQUESTS,
    seed: int = 0,
    sglang_fallback: bool = False,
    bindings: bool = True,
    copy_wait: CopyWait = "none",
    **options: Unpack[EngineOptions],
) -> SanitizeReport:
    """Sanitize one backend x algorithm combination; see the module docstring.

    ``options`` go to :func:`engine_config`: ``use_graphs``/``plant_node`` choose how
    decode-like forwards execute (eager, a graph with its node, a graph without);
    ``max_running`` bounds the batch (and the graph buckets); ``model`` replaces the reference
    model's configuration (a smaller one for fast tests);
    ``sglang_fallback`` installs :class:`SglangFallbackDecisions`. ``bindings`` adds the
    binding audit: the trace served once more by the overlap loop (fine fence, and the copy
    consumer ``copy_wait`` of :class:`~warcore.engine.EngineConfig`), every wait on a read-done
    event checked for the record it bound to (:mod:`warcore.audit.bindings`).
    Configuration errors (unknown names) raise; engine failures become ``report.error``.
    """
    pm = pm if pm is not None else get_plugin_manager()
    config = engine_config(backend, algorithm, **options)
    trace = trace_for(requests, seed)
    report = SanitizeReport(backend, algorithm, device, len(trace), config.flags)
    start = time.perf_counter()
    _clean_then_poisoned(report, config, pm, device, trace, legacy=sglang_fallback)
    if bindings and report.error is None:
        _audit_bindings(report, config, pm, device, trace, copy_wait, legacy=sglang_fallback)
    report.elapsed_s = time.perf_counter() - start
    return report


def _clean_then_poisoned(
    report: SanitizeReport,
    config: EngineConfig,
    pm: WarcorePluginManager,
    device: str,
    trace: list[Request],
    *,
    legacy: bool,
) -> None:
    """The clean run, which says where each forward records; then the poisoned run, poisoned
    at those points, compared with it step by step (into ``report``)."""
    clean = _run(config, pm, device, trace, plan=None, legacy=legacy)
    report.run_s["clean"] = clean.run_s
    plan = barrier_sources(clean.records)
    mark_poisoned(clean.records, plan)
    _summarise(report, clean.records)
    if clean.stopped is not None:
        report.error = f"the clean run failed: {clean.stopped}"
        return
    poisoned = _run(config, pm, device, trace, plan=plan, legacy=legacy, expected=clean)
    report.run_s["poisoned"] = poisoned.run_s
    mark_poisoned(poisoned.records, plan)
    if poisoned.stopped is not None:
        report.error = (
            f"the poisoned run failed (poison must never crash a forward): {poisoned.stopped}"
        )
        return
    _compare(report, clean, poisoned)


def _audit_bindings(
    report: SanitizeReport,
    config: EngineConfig,
    pm: WarcorePluginManager,
    device: str,
    trace: list[Request],
    copy_wait: CopyWait,
    *,
    legacy: bool,
) -> None:
    """Serve the trace with the overlap loop (the barrier runs only there) and audit which
    record every wait bound to. Binding happens on the host, so this is deterministic."""
    from warcore.engine import Engine

    overlap = replace(config, loop="overlap", fence="fine", copy_wait=copy_wait)
    with Engine(overlap, device=device, pm=pm) as engine:
        if legacy:
            fallback = SglangFallbackDecisions(pm)
            for runner in engine.runners:
                runner.decisions = fallback
        t0 = time.perf_counter()
        run = engine.run(trace)
        report.run_s["bindings"] = time.perf_counter() - t0
    if run.stopped is not None:
        report.error = f"the binding run failed: {run.stopped}"
        return
    report.bindings = binding_summary(run.bindings)
    report.binding_findings = audit_bindings(run.bindings)
    report.binding_log = list(run.bindings)


@dataclass
class _Run:
    """What one engine run left: every forward's outputs and every step's row state."""

    records: list[ForwardRecord]
    states: list[StepState]
    stopped: str | None = None
    run_s: float = 0.0


def _run(
    config: EngineConfig,
    pm: WarcorePluginManager,
    device: str,
    trace: list[Request],
    *,
    plan: frozenset[int] | None,
    legacy: bool,
    expected: _Run | None = None,
) -> _Run:
    """One engine run; with a ``plan``, poisoned at the record points of those forwards;
    with ``expected`` (the clean run), stopped at the first step that differs from it."""
    from warcore.engine import Engine

    # Closing the engine also drops its entries from the decision caches.
    with Engine(config, device=device, pm=pm) as engine:
        return _serve(engine, pm, trace, plan=plan, legacy=legacy, expected=expected)


def _serve(
    engine: Engine,
    pm: WarcorePluginManager,
    trace: list[Request],
    *,
    plan: frozenset[int] | None,
    legacy: bool,
    expected: _Run | None,
) -> _Run:
    if legacy:
        fallback = SglangFallbackDecisions(pm)
        for runner in engine.runners:
            runner.decisions = fallback
    poison = None
    if plan is not None:
        poison = SharedBufferPoison(engine.pool.shared_buffers(), engine.pool.num_slots)
    probe = SanitizerProbe(poison, plan or frozenset())
    for group in _groups(engine):
        group.set_probe(probe)
    differs = None if expected is None else _Divergence(expected)
    engine.worker = SanitizingWorker(
        engine.worker, probe, engine.device, engine.forward_stream, engine.rows, differs
    )
    result = _Run(probe.records, probe.states)
    t0 = time.perf_counter()
    try:
        report = engine.run(trace)
        result.stopped = getattr(report, "stopped", None)
    except Diverged:
        pass  # the comparison finds and reports the difference
    result.run_s = time.perf_counter() - t0
    engine.device.synchronize()
    for record in result.records:
        record.to_host()
    for state in result.states:
        state.to_host()
    return result


class _Divergence:
    """Whether a poisoned run so far differs from the clean run (each item checked once)."""

    def __init__(self, expected: _Run) -> None:
        self.expected = expected
        self.records = 0
        self.states = 0

    def __call__(self, probe: SanitizerProbe) -> bool:
        # Called before a step: every earlier step has run (the serial loop synchronized it).
        for record in probe.records[self.records :]:
            record.to_host()
            if _forward_difference(self.expected.records, record) is not None:
                return True
            self.records += 1
        for state in probe.states[self.states :]:
            state.to_host()
            if _state_difference(self.expected.states, state) is not None:
                return True
            self.states += 1
        return False


def _groups(engine: Engine) -> list[RunnerGroup]:
    draft: RunnerGroup | None = getattr(engine.worker, "draft", None)
    return [engine.target] + ([draft] if draft is not None else [])


def _summarise(report: SanitizeReport, records: list[ForwardRecord]) -> None:
    modes: dict[tuple[str, ForwardMode], ModeSummary] = {}
    for r in records:
        summary = modes.get((r.runner, r.mode))
        if summary is None:
            declared = r.decision.declared
            summary = ModeSummary(
                r.runner, r.mode, declared.boundary, declared.source, because=r.decision.source
            )
            modes[(r.runner, r.mode)] = summary
        summary.forwards += 1
        summary.checked += r.poisoned
        summary.record_points[r.decision.record_point] += 1
    report.modes = list(modes.values())
    report.forwards = len(records)
    report.checked = sum(r.poisoned for r in records)


def _compare(report: SanitizeReport, clean: _Run, poisoned: _Run) -> None:
    """Walk the poisoned run's forwards in launch order, each step's row state after its
    forwards, and report the first difference."""
    by_step: dict[int, list[ForwardRecord]] = {}
    for record in poisoned.records:
        by_step.setdefault(record.step, []).append(record)
    last_poisoned: ForwardRecord | None = None
    for step in sorted(by_step):
        for p in by_step[step]:
            difference = _forward_difference(clean.records, p)
            report.compared += 1
            if difference is not None:
                _violation(report, p, p.source, last_poisoned, difference, forward=True)
                return
            if p.source is not None:
                last_poisoned = p
        if step >= len(poisoned.states):
            break  # stopped before this step's end (only after a difference)
        difference = _state_difference(clean.states, poisoned.states[step])
        if difference is not None:
            last = by_step[step][-1]
            _violation(report, last, last.source, last_poisoned, difference, forward=False)
            return
    if len(clean.records) != len(poisoned.records):
        report.error = (
            f"the clean run had {len(clean.records)} forwards and the poisoned run "
            f"{len(poisoned.records)}, with no differing output"
        )


def _violation(
    report: SanitizeReport,
    at: ForwardRecord,
    source: ForwardRecord | None,
    last_poisoned: ForwardRecord | None,
    difference: str,
    *,
    forward: bool,
) -> None:
    kind: ViolationKind
    if source is not None and forward:
        kind = "late-read" if source is at else "later-forward"
    elif source is not None:
        kind = "later-work"
    elif last_poisoned is not None and last_poisoned.source is not None:
        kind, source = "poisoned-state", last_poisoned.source
    else:
        what = f"{at.label} (forward {at.index})" if forward else f"the state after step {at.step}"
        report.error = (
            f"the runs differ at {what} although nothing was poisoned before it: the engine is "
            f"not deterministic here ({difference})"
        )
        return
    where = f"{at.label} (forward {at.index})" if forward else f"row state after step {at.step}"
    report.violation = Violation(
        backend=report.backend,
        algorithm=report.algorithm,
        kind=kind,
        step=at.step,
        forward=at.index,
        runner=at.runner,
        forward_mode=at.mode,
        published_by=source.label,
        published_mode=source.mode,
        declared=source.decision.declared.boundary,
        declared_by=source.decision.declared.source,
        record_point=source.decision.record_point,
        difference=f"{where}: {difference}",
    )


def _forward_difference(expected: list[ForwardRecord], p: ForwardRecord) -> str | None:
    if p.index >= len(expected):
        return f"the poisoned run launched an extra forward, {p.label}"
    c = expected[p.index]
    if (c.runner, c.mode, c.rows) != (p.runner, p.mode, p.rows):
        return (
            f"the runs launched different forwards: {c.label} rows {list(c.rows)} clean, "
            f"{p.label} rows {list(p.rows)} poisoned"
        )
    return _first_difference(c, p)


def _state_difference(expected: list[StepState], p: StepState) -> str | None:
    if p.step >= len(expected):
        return "the poisoned run ran an extra step"
    c = expected[p.step]
    for name in ROW_STATE:
        a, b = c.tensors[name], p.tensors[name]
        rows = (_bytes(a) != _bytes(b)).reshape(a.shape[0], -1).any(-1)
        if bool(rows.any()):
            row = int(rows.nonzero()[0, 0])
            if a.is_floating_point():
                delta = float((a[row].double() - b[row].double()).abs().max())
                return f"row {row}: {name} differs (max |diff| {delta:.3g})"
            return f"row {row}: {name} {a[row].tolist()} clean, {b[row].tolist()} poisoned"
    return None


def _first_difference(c: ForwardRecord, p: ForwardRecord) -> str | None:
    assert c.tokens is not None and p.tokens is not None
    assert c.hidden is not None and p.hidden is not None
    assert c.sample is not None and p.sample is not None
    if c.tokens.shape != p.tokens.shape or c.hidden.shape != p.hidden.shape:
        return f"output shapes differ: {tuple(c.tokens.shape)} vs {tuple(p.tokens.shape)}"
    differs = c.tokens != p.tokens
    if bool(differs.any()):
        i, j = (int(x) for x in differs.nonzero()[0])
        return (
            f"request {i} (row {c.rows[i]}), query position {j}: token "
            f"{int(c.tokens[i, j])} clean, {int(p.tokens[i, j])} poisoned"
        )
    # Bit for bit: compare the bytes, so -0.0 vs 0.0 and NaN payloads count too.
    hidden_differs = (_bytes(c.hidden) != _bytes(p.hidden)).any(-1)
    if bool(hidden_differs.any()):
        i, j = (int(x) for x in hidden_differs.nonzero()[0])
        delta = (c.hidden[i, j].double() - p.hidden[i, j].double()).abs().max()
        return (
            f"request {i} (row {c.rows[i]}), query position {j}: same token, last hidden "
            f"state differs (max |diff| {float(delta):.3g})"
        )
    sample_differs = c.sample != p.sample
    if bool(sample_differs.any()):
        i = int(sample_differs.nonzero()[0, 0])
        return (
            f"request {i} (row {c.rows[i]}): {int(c.sample[i])} positions accepted clean, "
            f"{int(p.sample[i])} poisoned"
        )
    return None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)
