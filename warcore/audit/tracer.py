"""The read tracer: which ops of an eager forward read the scheduler-shared buffers, and where.

A ``TorchDispatchMode`` watches every aten op of the forward's work. An op *reads* a shared
buffer when one of its tensor arguments lives in that buffer's storage (matched by
``untyped_storage().data_ptr()``, so views and slices count) and the op's schema does not mark
that argument as written (``alias_info.is_write``); view ops move no data and are skipped. Each
read is tagged with its phase — the label the runner launched the work under (``load_batch``,
``out_graph_init``, ``in_graph_init``, ``layer<i>``, ...) — and with whether it came after the
forward's record point. Kernels outside torch's dispatcher are invisible to the mode; they
declare their reads with :func:`warcore.attention.declare_shared_read`.

Dispatch modes are thread-local and on ``sim`` the work runs on the stream's worker thread, so
the tracer wraps each launched piece of work and enters the mode *inside* it, wherever it runs.
It traces eager forwards (the tracer's engine runs without graphs): a replayed graph would run
work wrapped for another forward. The record points are then the eager ones
(``after_in_graph_init`` where a graph would have its node).

It also sees the work a step runs *after* its forwards (the drafter's ``propose``, the token
history it reads from; ``StepWorker`` launches that work through the target runner's probe):
such work is tagged to the forward it follows (``SharedRead.after_forward``). A shared read
there is later than any record point the forward has, so the forward's reads then allow no
boundary at all (``UNKNOWN``): the sanitizer's ``later-work``. What it cannot see, it says:
reads outside torch's dispatcher that nobody declared (numpy, a custom kernel without
:func:`~warcore.attention.declare_shared_read`), in the forwards or after them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from warcore.attention import AttentionBackend
from warcore.attention._reads import listening_for_shared_reads
from warcore.audit.sanitizer import Violation, engine_config, trace_for
from warcore.batch import ForwardBatch, StepInput
from warcore.core import (
    Decision,
    FlagValue,
    ForwardMode,
    RecordPoint,
    SharedReadBoundary,
    WarcorePluginManager,
    get_plugin_manager,
)
from warcore.runners import ForwardProbe, ModelRunner, Work

if TYPE_CHECKING:
    from warcore.engine import ModelConfig, Request
    from warcore.runners import RunnerGroup

__all__ = [
    "DEFAULT_TRACE_REQUESTS",
    "HOST_PREFIX",
    "ForwardTrace",
    "ModeReads",
    "ReadTrace",
    "ReadTracer",
    "SharedRead",
    "phase_name",
    "trace_reads",
    "violation_note",
    "watch_shared_reads",
]

HOST_PREFIX = "host:"
"""Names of staged host buffers among the traced buffers."""

DEFAULT_TRACE_REQUESTS = 6
"""The tracer costs ~20 µs per op: a handful of requests shows every mode."""

_PHASES = {
    "load_batch": "load_batch",
    "fill_inputs": "fill inputs",
    "out_graph_init": "out-graph init",
    "in_graph_init": "in-graph init",
    "embed": "embed",
    "sample": "sample",
    "draft_propose": "drafter propose",
    "record_history": "token history",
}

# Launch labels whose shared reads are over before a replay would start.
_BEFORE_REPLAY = frozenset({"load_batch", "fill_inputs", "out_graph_init"})


def phase_name(label: str) -> str:
    """A human name for a launch label: ``layer3`` -> ``layer 3``."""
    if label.startswith("layer") and label[5:].isdigit():
        return f"layer {label[5:]}"
    return _PHASES.get(label, label)


@dataclass(frozen=True)
class SharedRead:
    """One read of a shared buffer by one op (or one declared kernel)."""

    buffer: str
    op: str
    label: str
    """The launch label of the work the read is in."""
    launch: int
    """The position of that work among the forward's launches (its order in the stream)."""
    after_record_point: bool
    where: str = ""
    """The attention-backend method it ran in (``TorchNativeBackend.gather_page_table``)."""
    declared: bool = False
    """Declared by code outside torch's dispatcher, not seen by the mode."""
    after_forward: bool = False
    """In work the step ran after this forward had ended (the drafter's ``propose``)."""

    @property
    def host(self) -> bool:
        """A read of a staged host buffer (``host:<runner>.staging[i].<name>``), not of a
        device table: it bounds the slot's release, not the read-done event."""
        return self.buffer.startswith(HOST_PREFIX)

    @property
    def phase(self) -> str:
        name = phase_name(self.label)
        if self.label.startswith("layer") and self.where:
            return f"{name} attention"
        if self.after_forward:
            return f"{name}, after the forward"
        return name


@dataclass
class ForwardTrace:
    index: int
    runner: str
    mode: ForwardMode
    decision: Decision
    launches: list[str] = field(default_factory=list)
    reads: list[SharedRead] = field(default_factory=list)
    point_after: int | None = None
    """How many of the forward's launches precede its record point (``None``: no point)."""

    @property
    def record_point(self) -> RecordPoint:
        return self.decision.record_point

    @property
    def last_read(self) -> SharedRead | None:
        return _latest([r for r in self.reads if not r.host])


@dataclass
class ModeReads:
    """The reads of one runner's forwards of one mode, over the whole trace."""

    runner: str
    mode: ForwardMode
    declared: SharedReadBoundary
    declared_by: str
    record_points: set[RecordPoint]
    forwards: int
    reads: int
    reads_after_point: int
    last: SharedRead | None
    """The latest read of a device table in stream order over all these forwards."""
    host_reads: int = 0
    """Reads of the forwards' staged host buffers (not counted in ``reads``)."""
    host_last: SharedRead | None = None
    """The latest of those: where the host slot may be released at the earliest."""

    @property
    def last_phase(self) -> str:
        return "none" if self.last is None else self.last.phase

    @property
    def implied(self) -> SharedReadBoundary:
        """The earliest boundary the observed reads allow (what an honest declaration says);
        ``UNKNOWN`` when work after the forward read shared buffers (no record point in the
        forward is late enough)."""
        if self.last is None or self.last.label in _BEFORE_REPLAY:
            return SharedReadBoundary.PRE_REPLAY
        if self.last.after_forward:
            return SharedReadBoundary.UNKNOWN
        if self.last.label == "in_graph_init":
            return SharedReadBoundary.IN_REPLAY
        return SharedReadBoundary.POST_REPLAY

    def reads_allow(self, *, partial: bool = False) -> str:
        """What the reads allow, in words, for notes beside a verdict (``partial``: the trace
        is known to miss a read, so say it is what the reads *seen* allow)."""
        if self.implied is SharedReadBoundary.UNKNOWN:
            return (
                "work after the forward reads shared buffers, so no record point in the "
                "forward is late enough (UNKNOWN: the step must not publish before that work)"
            )
        return f"the reads {'it saw ' if partial else ''}allow {self.implied.name}"

    def summary(self) -> str:
        if self.last is None:
            return "no shared read"
        where = f" ({self.last.where})" if self.last.where else ""
        kind = ", declared" if self.last.declared else ""
        return f"last shared read: {self.last.phase}{where}, {self.last.buffer}{kind}"

    def host_summary(self) -> str:
        """Where the staged host buffers were read last (``load_batch``'s copies, for a
        backend that reads no host buffer itself)."""
        last = self.host_last
        if last is None:
            return "no host-buffer read"
        where = f" ({last.where})" if last.where else ""
        return (
            f"last host-buffer read: {last.phase}{where}, {last.buffer.removeprefix(HOST_PREFIX)}"
        )


@dataclass
class ReadTrace:
    backend: str
    algorithm: str
    forwards: list[ForwardTrace]

    def modes(self) -> list[ModeReads]:
        """Per (runner, mode), in first-seen order."""
        grouped: dict[tuple[str, ForwardMode], list[ForwardTrace]] = {}
        for f in self.forwards:
            grouped.setdefault((f.runner, f.mode), []).append(f)
        return [_mode_reads(runner, mode, fs) for (runner, mode), fs in grouped.items()]

    def mode(self, mode: ForwardMode, runner: str = "target") -> ModeReads:
        for m in self.modes():
            if m.mode is mode and m.runner == runner:
                return m
        seen = ", ".join(f"{m.runner} {m.mode.name}" for m in self.modes())
        raise KeyError(f"no {runner} {mode.name} forward in the trace (traced: {seen})")

    def last_shared_read(self, mode: ForwardMode, runner: str = "target") -> str:
        """``"in-graph init"``, ``"layer 3 attention"``, ...: the phase of the latest read."""
        return self.mode(mode, runner).last_phase


def _mode_reads(runner: str, mode: ForwardMode, forwards: list[ForwardTrace]) -> ModeReads:
    every = [r for f in forwards for r in f.reads]
    reads = [r for r in every if not r.host]
    host = [r for r in every if r.host]
    last = _latest(reads)
    declared = forwards[0].decision.declared
    return ModeReads(
        runner=runner,
        mode=mode,
        declared=declared.boundary,
        declared_by=declared.source,
        record_points={f.record_point for f in forwards},
        forwards=len(forwards),
        reads=len(reads),
        reads_after_point=sum(r.after_record_point for r in reads),
        last=last,
        host_reads=len(host),
        host_last=_latest(host),
    )


def _latest(reads: list[SharedRead]) -> SharedRead | None:
    """The read latest in stream order: the highest launch, and within one launch the last
    (a forward's reads are appended in the order they ran)."""
    last: SharedRead | None = None
    for read in reads:
        if last is None or read.launch >= last.launch:
            last = read
    return last


def violation_note(trace: ReadTrace, violation: Violation) -> str:
    """The tracer's account beside a sanitizer verdict: for the modes the violation names, the
    last shared read and what the reads allow. Where the traced reads do not explain the
    verdict (none later than the record point the violation started at), it says that the
    tracer cannot see that read, rather than a boundary that contradicts the verdict."""
    lines = [f"read tracer, {trace.backend} / {trace.algorithm} (eager run):"]
    modes = (violation.forward_mode, violation.published_mode)
    named = [m for m in trace.modes() if m.mode in modes]
    publisher = [m for m in named if f"{m.runner} {m.mode.name}" == violation.published_by]
    blind = not any(m.implied > violation.record_point.boundary for m in publisher)
    for m in named:
        lines.append(f"  {m.runner} {m.mode.name}: {m.summary()}; {m.reads_allow(partial=blind)}")
    if blind:
        where = (
            "in the work after the forwards"
            if violation.kind == "later-work"
            else f"after {violation.published_by}'s record point"
        )
        lines.append(
            f"  the tracer saw no shared read {where} to explain this {violation.kind}: it "
            "cannot see a read outside torch's dispatcher that is not declared (numpy, a "
            "custom kernel: warcore.attention.declare_shared_read), nor one only a captured "
            "graph makes (it traces eager forwards)"
        )
    return "\n".join(lines)


# -- the probe and the dispatch mode -------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Work:
    """What the mode appends to: one launched piece of work of one forward."""

    reads: list[SharedRead]
    label: str
    launch: int
    after: bool
    storages: dict[int, str]
    after_forward: bool = False

    def add(self, buffer: str, op: str, declared: bool) -> None:
        where = _backend_method()
        read = SharedRead(
            buffer, op, self.label, self.launch, self.after, where, declared, self.after_forward
        )
        # list.append is atomic: the work runs on a stream thread, the host reads after a sync.
        self.reads.append(read)

    def declared_read(self, tensor: torch.Tensor, kernel: str) -> None:
        buffer = self.storages.get(tensor.untyped_storage().data_ptr())
        if buffer is not None:
            self.add(buffer, f"declared:{kernel}", declared=True)


def _backend_method() -> str:
    """The innermost attention-backend method on the stack (only called on a hit)."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, AttentionBackend):
            return f"{type(owner).__name__}.{frame.f_code.co_name}"
        frame = frame.f_back
    return ""


_VIEW_CACHE: dict[Any, bool] = {}


def _is_view(func: Any) -> bool:
    """Ops whose result aliases an input without writing it (``view``, ``slice``, ...)."""
    cached = _VIEW_CACHE.get(func)
    if cached is None:
        returns = func._schema.returns
        alias = returns[0].alias_info if len(returns) == 1 else None
        cached = alias is not None and not alias.is_write
        _VIEW_CACHE[func] = cached
    return cached


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class _ReadMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, work: _Work) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.work = work

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if not _is_view(func):
            self._scan(func, args, kwargs)
        return func(*args, **kwargs)

    def _scan(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        storages = self.work.storages
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                continue  # written (an ``out=`` or the self of an in-place op), not read
            value = args[i] if not arg.kwarg_only and i < len(args) else kwargs.get(arg.name)
            for tensor in _tensors(value):
                buffer = storages.get(tensor.untyped_storage().data_ptr())
                if buffer is not None:
                    self.work.add(buffer, str(func), declared=False)


class ReadTracer(ForwardProbe):
    """A forward probe that records every shared read of every forward it sees."""

    in_graph = False  # eager forwards only: it never acts inside a graph

    def __init__(self, buffers: Mapping[str, torch.Tensor]) -> None:
        self._storages = _storages(buffers)
        self.forwards: list[ForwardTrace] = []
        self._current: ForwardTrace | None = None
        self._ended: ForwardTrace | None = None
        """The forward that ended last, while no other has begun: the step's work after it
        (``StepWorker`` wraps it through this probe) is traced as that forward's."""
        self._passed = False
        self._staged: dict[str, ForwardTrace] = {}
        """Runner -> the reads staged for its next forward (stage, then publish)."""
        self._paused: tuple[ForwardTrace | None, ForwardTrace | None, bool] | None = None

    def begin_staging(self, runner: ModelRunner, step: StepInput) -> None:
        # Traced as the later forward's own first launches, not as work after the forward
        # that ended last: a holder whose lists that forward's trace takes over.
        self._paused = (self._current, self._ended, self._passed)
        holder = ForwardTrace(-1, runner.name, step.forward_mode, None)  # type: ignore[arg-type]
        self._staged[runner.name] = holder
        self._current, self._ended, self._passed = holder, None, False

    def end_staging(self, runner: ModelRunner) -> None:
        if self._paused is not None:
            self._current, self._ended, self._passed = self._paused
            self._paused = None

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        self._current = ForwardTrace(len(self.forwards), runner.name, step.forward_mode, decision)
        held = self._staged.pop(runner.name, None)
        if held is not None and held.mode is step.forward_mode:
            # The staged launches' work appends to these lists when it runs (on sim, later).
            self._current.launches, self._current.reads = held.launches, held.reads
        self.forwards.append(self._current)
        self._ended = None
        self._passed = False
        # A graph replay runs work wrapped at capture: only eager record points can be marked.
        return decision.record_point is not RecordPoint.IN_GRAPH_NODE

    def wrap(self, runner: ModelRunner, label: str, fn: Work) -> Work:
        forward, after = self._current, False
        if forward is None:
            forward, after = self._ended, True
        if forward is None:
            return fn  # not inside or after a forward this tracer began (a capture)
        work = _Work(
            forward.reads,
            label,
            len(forward.launches),
            self._passed or after,
            self._storages,
            after,
        )
        forward.launches.append(label)

        def traced() -> object:
            with _ReadMode(work), listening_for_shared_reads(work.declared_read):
                return fn()

        return traced

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        if self._current is not None:
            self._passed = True
            self._current.point_after = len(self._current.launches)

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        self._ended, self._current = self._current, None


def _storages(buffers: Mapping[str, torch.Tensor]) -> dict[int, str]:
    return {t.untyped_storage().data_ptr(): name for name, t in buffers.items()}


@contextmanager
def watch_shared_reads(
    buffers: Mapping[str, torch.Tensor], label: str = ""
) -> Iterator[list[SharedRead]]:
    """The reads of ``buffers`` by the ops this thread runs in the block (and the reads
    declared with :func:`~warcore.attention.declare_shared_read`), as a list filled in place:
    the tracer's core, for one piece of code."""
    reads: list[SharedRead] = []
    work = _Work(reads, label, 0, False, _storages(buffers))
    with _ReadMode(work), listening_for_shared_reads(work.declared_read):
        yield reads


def trace_reads(
    backend: str,
    algorithm: str = "none",
    *,
    pm: WarcorePluginManager | None = None,
    device: str = "sim",
    requests: int | Sequence[Request] = DEFAULT_TRACE_REQUESTS,
    seed: int = 0,
    flags: Mapping[str, FlagValue] | None = None,
    num_draft: int = 4,
    model: ModelConfig | None = None,
) -> ReadTrace:
    """Serve a small trace eagerly (serial loop, no graphs) with the tracer on every runner;
    ``model`` replaces the reference model's configuration."""
    from warcore.engine import Engine

    pm = pm if pm is not None else get_plugin_manager()
    config = engine_config(
        backend, algorithm, flags=flags, use_graphs=False, num_draft=num_draft, model=model
    )
    trace = trace_for(requests, seed)
    with Engine(config, device=device, pm=pm) as engine:
        buffers = dict(engine.pool.shared_buffers())
        for runner in engine.runners:
            for name, tensor in runner.staging.buffers().items():
                buffers[f"{HOST_PREFIX}{runner.name}.{name}"] = tensor
        tracer = ReadTracer(buffers)
        draft: RunnerGroup | None = getattr(engine.worker, "draft", None)
        for group in [engine.target] + ([draft] if draft is not None else []):
            group.set_probe(tracer)
        engine.run(trace)
        engine.device.synchronize()
    return ReadTrace(backend, algorithm, tracer.forwards)
