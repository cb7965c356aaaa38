"""The sanitizer's instruments inside one engine: a forward probe and a step wrapper.

The probe keeps every forward's outputs (in stream order, so it works on both devices) and, in
the poisoned run, launches the poison at the record point of the forwards a *plan* names: the
forward whose read-done event the scheduler's barrier takes in each step. The step wrapper
snapshots the shared buffers before a step and restores them after it, so the poison lasts from
the step's read-done point to the end of the step: exactly the window in which an overlap
scheduler may already rewrite those buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass, field

import torch

from warcore.audit._poison import SharedBufferPoison
from warcore.batch import ForwardBatch, RowState, StepInput
from warcore.core import Decision, ForwardMode, RecordPoint
from warcore.device import Device, Stream
from warcore.engine.spec import Worker
from warcore.runners import ForwardProbe, ModelRunner, StepOutput

__all__ = [
    "Diverged",
    "ForwardRecord",
    "SanitizerProbe",
    "SanitizingWorker",
    "StepState",
    "barrier_sources",
    "mark_poisoned",
]


@dataclass(eq=False)
class ForwardRecord:
    """One forward of a sanitized run and the outputs it produced."""

    index: int
    step: int
    runner: str
    mode: ForwardMode
    decision: Decision
    rows: tuple[int, ...]
    mailbox: bool
    """Its runner is the one whose mailbox the scheduler's barrier takes after the step."""
    poisoned: bool = False
    """It ran, from its own record point or entirely, with the shared buffers poisoned."""
    source: ForwardRecord | None = None
    """The forward of its step whose record point started the poison (itself, if it did)."""
    tokens: torch.Tensor | None = field(default=None, repr=False)
    hidden: torch.Tensor | None = field(default=None, repr=False)
    sample: torch.Tensor | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.runner} {self.mode.name}"

    def keep(self, tokens: torch.Tensor, hidden: torch.Tensor, sample: torch.Tensor) -> None:
        """Device work: copy the outputs before the next forward overwrites them."""
        self.tokens, self.hidden, self.sample = tokens.clone(), hidden.clone(), sample.clone()

    def to_host(self) -> None:
        for name in ("tokens", "hidden", "sample"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.cpu())


def barrier_sources(records: list[ForwardRecord]) -> frozenset[int]:
    """The forwards whose read-done event a barrier takes: per step, the last forward of the
    mailbox runner, if it publishes (an earlier one's event was replaced by its ``None``)."""
    last: dict[int, ForwardRecord] = {}
    for record in records:
        if record.mailbox:
            last[record.step] = record
    return frozenset(r.index for r in last.values() if r.decision.record_point.publishes)


def mark_poisoned(records: list[ForwardRecord], plan: Set[int]) -> None:
    """Set ``poisoned``/``source``: a planned forward and every later forward of its step."""
    source: ForwardRecord | None = None
    step = None
    for record in records:
        if record.step != step:
            step, source = record.step, None
        if record.index in plan and source is None:
            source = record
        record.source = source
        record.poisoned = source is not None


class SanitizerProbe(ForwardProbe):
    """Records each forward; with ``poison``, poisons at the record point of the forwards
    (by index, in launch order) that ``plan`` names."""

    def __init__(self, poison: SharedBufferPoison | None, plan: Set[int] = frozenset()) -> None:
        self.poison = poison
        self.plan = plan
        self.in_graph = poison is not None  # the clean run never acts at a record point
        self.records: list[ForwardRecord] = []
        self.states: list[StepState] = []
        self.step = -1
        self._mailbox = ""
        self._current: ForwardRecord | None = None

    def new_step(self, mailbox: str) -> None:
        self.step += 1
        self._mailbox = mailbox

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        record = ForwardRecord(
            index=len(self.records),
            step=self.step,
            runner=runner.name,
            mode=step.forward_mode,
            decision=decision,
            rows=tuple(step.rows),
            mailbox=runner.name == self._mailbox,
        )
        self.records.append(record)
        self._current = record
        return self.poison is not None and record.index in self.plan

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        poison = self.poison
        if poison is not None:
            # On the forward stream, right after the read-done record: inside the probe graph
            # for IN_GRAPH_NODE (this call is then part of its capture), eager otherwise. The
            # poison is idempotent, so every capture may hold it.
            runner.device.launch(poison.poison, "sanitizer_poison")

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        record = self._current
        if record is None:
            return
        self._current = None
        bs = step.batch_size
        tokens, hidden, sample = runner.outputs(fb)
        runner.device.launch(
            lambda: record.keep(tokens[:bs], hidden[:bs], sample[:bs]), "sanitizer_keep"
        )


ROW_STATE = ("kv_len", "token", "feature", "drafts")
"""What a step leaves for the next one (:class:`~warcore.batch.RowState`): compared too, so
work after the step's last forward (a drafter, the commit) is audited like a forward."""


@dataclass(eq=False)
class StepState:
    """The per-row state at the end of one step."""

    step: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    def keep(self, rows: RowState) -> None:
        """Device work: copy the row state as the step left it."""
        self.tensors = {name: getattr(rows, name).clone() for name in ROW_STATE}

    def to_host(self) -> None:
        self.tensors = {name: t.cpu() for name, t in self.tensors.items()}


class Diverged(Exception):
    """Raised into the engine's loop to stop a poisoned run once its outputs differ."""


@dataclass(eq=False)
class SanitizingWorker:
    """Wraps the engine's worker: numbers the steps, brackets each one with the buffers'
    snapshot (before) and restore (after) on the forward stream, and keeps the row state each
    step leaves.

    ``differs(probe)``, called before each step (the serial loop has synchronized the last
    one), stops the run with :class:`Diverged` once it says the outputs so far differ: past the
    first difference the runs are not comparable, so running on would only cost time.
    """

    inner: Worker
    probe: SanitizerProbe
    device: Device
    stream: Stream
    rows: RowState
    differs: Callable[[SanitizerProbe], bool] | None = None

    @property
    def draft(self) -> object:
        """The engine lists its runners through ``worker.draft`` (EAGLE's draft group)."""
        return getattr(self.inner, "draft", None)

    @property
    def mailbox(self) -> ModelRunner | None:
        return self.inner.mailbox

    def launch(self, step: StepInput) -> StepOutput:
        if self.differs is not None and self.differs(self.probe):
            raise Diverged
        probe, poison, rows = self.probe, self.probe.poison, self.rows
        owner = self.inner.mailbox
        probe.new_step(owner.name if owner is not None else "")
        if poison is not None:
            with self.device.use_stream(self.stream):
                self.device.launch(poison.snapshot, "sanitizer_snapshot")
        first = len(probe.records)
        out = self.inner.launch(step)
        # The barrier's runner is known once the step launched: a staged prefill step's is the
        # target's, whoever owns the algorithm's event (stage, then publish).
        after = self.inner.mailbox
        name = after.name if after is not None else ""
        for record in probe.records[first:]:
            record.mailbox = record.runner == name
        state = StepState(probe.step)
        probe.states.append(state)
        with self.device.use_stream(self.stream):
            # Before the restore: the state is what the step computed with the poison in place.
            self.device.launch(lambda: state.keep(rows), "sanitizer_keep_state")
            if poison is not None:
                self.device.launch(poison.restore, "sanitizer_restore")
        return out
