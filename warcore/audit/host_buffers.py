"""The host-buffer sanitizer: no read of a staged host buffer after the point that releases it.

Each forward's host inputs are staged in a slot of its runner's
:class:`~warcore.batch.HostStaging` ring; the host rewrites the slot once the slot's release
point is reached (:func:`~warcore.core.host_release_point`: the forward's read-done event when
that covers the backend's declared ``host_reads``, else its done event). A depth-only ring
(``staging_guard=False``) shallower than the steps in flight has no release point at all: the
overlap loop may rewrite the slot before the forward's own copy has executed.

Like the WAR sanitizer it serves one trace twice with the serial loop (deterministic): a clean
run, and a run in which every forward's slot is overwritten with poison exactly at its release
point, in stream order on the forward stream (before ``load_batch``'s copy for an unsound
ring). Any forward whose sampled tokens, hidden states or accepted counts differ read a host
buffer after its release: the report names the runner, the mode, the release point and the
backend's declaration. Sim only: on CUDA, host work launched on a stream runs when it is
enqueued, so the poison would not land in stream order (a host callback would be needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from warcore.batch import ForwardBatch, StagedInputs, StepInput
from warcore.core import (
    Decision,
    ForwardMode,
    RecordPoint,
    SharedReadBoundary,
    WarcorePluginManager,
    get_plugin_manager,
    host_release_point,
)
from warcore.runners import ForwardProbe, ModelRunner, Work

if TYPE_CHECKING:
    from warcore.engine import EngineConfig, Request
    from warcore.engine.hicache import PrefixCacheStats

__all__ = [
    "HostBufferReport",
    "HostBufferViolation",
    "HostKVTierReport",
    "sanitize_host_buffers",
    "sanitize_host_kv_tier",
]

BEFORE_COPY = "before its own copy (depth-only ring shallower than the steps in flight)"


@dataclass(frozen=True)
class HostBufferViolation:
    """The first forward whose outputs changed when its staged host buffers were poisoned."""

    forward: int
    runner: str
    mode: ForwardMode
    released: str
    """Where the slot was released (a record point, ``done``, or :data:`BEFORE_COPY`)."""
    declared: SharedReadBoundary | None
    """The backend's ``host_reads`` for the mode (``None``: it declares no host read)."""
    difference: str

    def describe(self) -> str:
        declared = "no host read" if self.declared is None else f"host reads {self.declared.name}"
        return (
            f"VIOLATION (host buffer) {self.runner} {self.mode.name} (forward {self.forward}): "
            f"its staged host buffers were released {self.released} (backend declares "
            f"{declared}) but the forward read them later; first differing output: "
            f"{self.difference}"
        )


@dataclass
class HostBufferReport:
    forwards: int = 0
    poisoned: int = 0
    """Forwards whose slot was poisoned before the forward ended (the others are released
    by their done event: nothing can read after it)."""
    released: dict[str, int] = field(default_factory=dict)
    violation: HostBufferViolation | None = None

    @property
    def sound(self) -> bool:
        return self.violation is None

    def format(self) -> str:
        verdict = "sound" if self.sound else "VIOLATION"
        where = ", ".join(f"{k} x{n}" for k, n in sorted(self.released.items()))
        lines = [
            f"host buffers: {verdict}; {self.poisoned} of {self.forwards} forwards poisoned at "
            f"their release point ({where})"
        ]
        if self.violation is not None:
            lines.append("  " + self.violation.describe())
        return "\n".join(lines)


@dataclass(eq=False)
class _Forward:
    runner: str
    mode: ForwardMode
    rows: tuple[int, ...]
    released: str
    declared: SharedReadBoundary | None
    outputs: list[torch.Tensor] = field(default_factory=list)


def poison_slot(slot: StagedInputs, max_reqs: int, vocab: int) -> None:
    """Overwrite a slot's live entries with valid but different values: rows and prompt
    tokens shifted within their ranges, query lengths moved within ``0..max_q``."""
    bs, mq = slot.batch_size, slot.max_q
    rows = slot.rows[:bs]
    rows.add_(max(1, max_reqs // 2) | 1).remainder_(max_reqs)
    q = slot.q_lens[:bs]
    q.add_(1).remainder_(mq + 1)
    if slot.has_prompt:
        p = slot.prompt[: bs * mq]
        p.add_(max(1, vocab // 2) | 1).remainder_(vocab)


class _HostProbe(ForwardProbe):
    in_graph = False  # host slots are never released at the in-graph node

    def __init__(self, poison: bool, vocab: int) -> None:
        self.poison = poison
        self.vocab = vocab
        self.forwards: list[_Forward] = []
        self._release = RecordPoint.NONE

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        mode = step.forward_mode
        until = runner.host_reads.get(mode)
        self._release = host_release_point(decision.record_point, until)
        sound = runner.staging.sound
        released = "at done" if self._release is RecordPoint.NONE else self._release.value
        self.forwards.append(
            _Forward(runner.name, mode, tuple(step.rows), released if sound else BEFORE_COPY, until)
        )
        return self.poison and decision.record_point is not RecordPoint.IN_GRAPH_NODE

    def wrap(self, runner: ModelRunner, label: str, fn: Work) -> Work:
        slot = runner.staged
        if not (self.poison and label == "load_batch" and slot is not None):
            return fn
        if runner.staging.sound:
            return fn
        max_reqs = runner.pool.max_reqs

        def poisoned_then_copy() -> object:
            poison_slot(slot, max_reqs, self.vocab)  # the host's rewrite won the race
            return fn()

        return poisoned_then_copy

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        slot = runner.staged
        if point is not self._release or slot is None or not runner.staging.sound:
            return
        max_reqs, vocab = runner.pool.max_reqs, self.vocab
        runner.device.launch(lambda: poison_slot(slot, max_reqs, vocab), "host_poison")

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        record = self.forwards[-1]
        bs = step.batch_size
        tokens, hidden, sample = runner.outputs(fb)

        def keep() -> None:
            record.outputs = [tokens[:bs].clone(), hidden[:bs].clone(), sample[:bs].clone()]

        runner.device.launch(keep, "host_sanitizer_keep")


def sanitize_host_buffers(
    config: EngineConfig,
    requests: Sequence[Request],
    *,
    pm: WarcorePluginManager | None = None,
) -> HostBufferReport:
    """Serve ``requests`` twice on ``sim`` (serial loop), clean and with every forward's
    staged host buffers poisoned at their release point; the first forward that differs is
    the violation."""
    from dataclasses import replace

    pm = pm if pm is not None else get_plugin_manager()
    config = replace(config, loop="serial")
    clean = _serve(config, requests, pm, poison=False)
    dirty = _serve(config, requests, pm, poison=True)
    report = HostBufferReport(forwards=len(dirty))
    for f in dirty:
        report.released[f.released] = report.released.get(f.released, 0) + 1
    report.poisoned = sum(f.released != "at done" for f in dirty)
    for i, (c, p) in enumerate(zip(clean, dirty, strict=False)):
        difference = _difference(c, p)
        if difference is not None:
            report.violation = HostBufferViolation(
                i, p.runner, p.mode, p.released, p.declared, difference
            )
            break
    return report


def _serve(
    config: EngineConfig, requests: Sequence[Request], pm: WarcorePluginManager, *, poison: bool
) -> list[_Forward]:
    from warcore.engine import Engine

    with Engine(config, device="sim", pm=pm) as engine:
        probe = _HostProbe(poison, config.model.vocab_size)
        draft = getattr(engine.worker, "draft", None)
        for group in [engine.target] + ([draft] if draft is not None else []):
            group.set_probe(probe)
        engine.run(list(requests))
        engine.device.synchronize()
    return probe.forwards


def _difference(c: _Forward, p: _Forward) -> str | None:
    if (c.runner, c.mode, c.rows) != (p.runner, p.mode, p.rows):
        return f"the runs launched different forwards: {c.runner} {c.mode.name} rows {c.rows}"
    names = ("tokens", "hidden states", "accepted counts")
    for name, a, b in zip(names, c.outputs, p.outputs, strict=True):
        if a.shape != b.shape or not torch.equal(a, b):
            return f"{name} differ"
    return None


@dataclass
class HostKVTierReport:
    """The host KV tier's copies in one overlap run: each judged against the fences the
    engine actually took (:func:`~warcore.engine.hicache.copy_order_problem`)."""

    stats: PrefixCacheStats
    unordered: list[str] = field(default_factory=list)
    """Copies not ordered behind the last forward touching their slots (the first 20)."""

    @property
    def clean(self) -> bool:
        return not self.unordered


def sanitize_host_kv_tier(
    config: EngineConfig,
    requests: Sequence[Request],
    *,
    pm: WarcorePluginManager | None = None,
) -> HostKVTierReport:
    """Serve ``requests`` with the host KV tier on (the ``hicache`` flag added to ``config``'s
    flags) on ``sim``, and report every offload or load-back its stream was not ordered
    behind the forwards touching its slots. Host bookkeeping of the fences taken, not a race:
    the verdict is the same in every run of the same trace and configuration."""
    from dataclasses import replace

    from warcore.engine import Engine

    pm = pm if pm is not None else get_plugin_manager()
    flags = tuple(f for f in config.flags if f[0] != "hicache") + (("hicache", True),)
    with Engine(replace(config, flags=flags), device="sim", pm=pm) as engine:
        report = engine.run(list(requests))
    stats = report.prefix_cache
    assert stats is not None  # the flag is on
    return HostKVTierReport(stats, list(stats.unordered))
