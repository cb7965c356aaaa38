"""Steps as data: the forwards one step of a speculative algorithm runs (DESIGN §9).

An algorithm plugin describes its step with a :class:`StepSpec` on its
:class:`~warcore.AlgorithmSpec` (``step=``): which forwards run, in what order, on which runner
(the ``target`` model or the ``draft`` model), which of them is the step's last reader of the
scheduler-shared buffers (and so owns the read-done event), whether a drafter proposes the next
drafts after the commit, and how drafts are accepted. The built-in families are three uses of
it (:mod:`warcore.engine.steps`)::

    from warcore import ForwardMode, Phase, StepSpec

    # k draft-model decode steps, then one target verify; no draft-extend: the verify is the
    # step's last shared reader, so the target runner owns the step's event.
    K_DRAFT_VERIFY = StepSpec(
        prefill=(Phase("target", ForwardMode.EXTEND), Phase("draft", ForwardMode.DRAFT_EXTEND)),
        decode=(
            Phase("draft", ForwardMode.DECODE, repeat="num_draft"),
            Phase("target", ForwardMode.TARGET_VERIFY),
        ),
    )

What a step says about the read-done event:

* The **last reader** of each sequence is the phase flagged ``last_reader=True``, or its last
  phase when none is flagged (in the reference engine every forward reads ``req_to_token`` when
  it loads its batch, so the last forward is the honest answer; an engine whose later forwards
  read only private copies flags an earlier phase).
* The **event owner** (``warcore_step_event_owner``'s answer) is the runner of the decode
  sequence's last reader.
* The **publish phases** (``warcore_is_war_publish_phase``'s answers) are the modes of the last
  readers that a runner can publish (:data:`PUBLISHING_MODES`): the decode sequence's, and the
  prefill sequence's when it runs on the owner (otherwise the owner's event would be taken
  before the other runner's prefill reads, so the prefill keeps the coarse fence).

Those hooks stay the authority: when no plugin answers them for an algorithm that declares a
step, the core answers from the step (provenance ``step:<plugin>``), so an author states the
owner once; ``warcore check`` reports a step whose hook answers disagree with it.

What the reference engine can run of it, and the built-in families' steps, are the engine's
(:mod:`warcore.engine.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._modes import ForwardMode

__all__ = ["NUM_DRAFT", "PUBLISHING_MODES", "Phase", "StepSpec"]

Runner = Literal["target", "draft"]
RUNNERS: tuple[Runner, ...] = ("target", "draft")

NUM_DRAFT: Literal["num_draft"] = "num_draft"
"""``Phase.repeat``: as many times as the engine's draft tokens per verify."""

PUBLISHING_MODES = frozenset(
    {ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2}
)
"""Modes a runner can publish a read-done event for (prefill runner: ``EXTEND``; decode and
draft-decode runners: ``DECODE``, ``TARGET_VERIFY``; draft-extend runner: ``DRAFT_EXTEND_V2``).
A last reader in any other mode leaves its step on the coarse fence."""


@dataclass(frozen=True)
class Phase:
    """One forward of a step (or ``repeat`` of them in a row) on one runner.

    ``runner``: ``"target"`` or ``"draft"`` (the draft model's runner: its own K/V, the
    target's tables). ``mode``: the :class:`~warcore.ForwardMode` it runs in (a member or its
    name). ``repeat``: how many forwards in a row, an int or ``"num_draft"``. ``last_reader``:
    this phase is the step's last reader of the scheduler-shared buffers (at most one per
    sequence; default: the sequence's last phase).
    """

    runner: Runner
    mode: ForwardMode
    repeat: int | Literal["num_draft"] = 1
    last_reader: bool = False

    def __post_init__(self) -> None:
        if self.runner not in RUNNERS:
            raise ValueError(f"Phase runner must be 'target' or 'draft', got {self.runner!r}")
        if not isinstance(self.mode, ForwardMode):
            try:
                object.__setattr__(self, "mode", ForwardMode.parse(self.mode))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"Phase mode: {exc}") from None
        repeat = self.repeat
        if repeat != NUM_DRAFT and (
            not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1
        ):
            raise ValueError(f"Phase repeat must be an int >= 1 or 'num_draft', got {repeat!r}")
        if not isinstance(self.last_reader, bool):
            raise TypeError(f"Phase last_reader must be a bool, got {self.last_reader!r}")

    def describe(self) -> str:
        times = "" if self.repeat == 1 else f" x{self.repeat}"
        return f"{self.runner} {self.mode.name}{times}{'*' if self.last_reader else ''}"


def _phases(value: object) -> object:
    """A single phase or a list of them, as the tuple the spec stores (anything else stays,
    for :meth:`StepSpec.problem` to name)."""
    if isinstance(value, Phase):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class StepSpec:
    """The forwards of one step of an algorithm, in launch order; see the module docstring.

    ``decode``: a decode (or verify) step; ``prefill``: a prefill step (default: the target's
    ``EXTEND`` alone); ``propose``: the algorithm's drafter writes the next step's drafts after
    the commit (dflash, n-gram); ``acceptance``: how drafts are accepted (the reference engine
    knows ``greedy_prefix``). :class:`~warcore.AlgorithmSpec` checks the spec when it is built
    and raises ``ValueError`` naming the algorithm and the problem (:meth:`problem`).
    """

    decode: tuple[Phase, ...]
    prefill: tuple[Phase, ...] = (Phase("target", ForwardMode.EXTEND),)
    propose: bool = False
    acceptance: str = "greedy_prefix"

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", _phases(self.decode))
        object.__setattr__(self, "prefill", _phases(self.prefill))

    def problem(self) -> str | None:
        """What is wrong with this spec's structure, or ``None``."""
        for label, phases in (("decode", self.decode), ("prefill", self.prefill)):
            if not isinstance(phases, tuple) or not all(isinstance(p, Phase) for p in phases):
                return f"{label} must be a tuple of warcore.Phase, got {phases!r}"
            if not phases:
                return f"{label} has no phase"
            if sum(p.last_reader for p in phases) > 1:
                return f"{label} flags more than one phase last_reader"
            reader = _last_reader(phases)
            at = next(i for i, p in enumerate(phases) if p is reader)
            later = [p for p in phases[at + 1 :] if p.runner == reader.runner]
            if later:
                return (
                    f"{label}: the last reader {reader.describe()} is followed by "
                    f"{later[0].describe()} on the same runner, whose forward would replace its "
                    "read-done event in the runner's mailbox (flag the later phase, or reorder)"
                )
        if not isinstance(self.propose, bool):
            return f"propose must be a bool, got {self.propose!r}"
        if not isinstance(self.acceptance, str) or not self.acceptance:
            return f"acceptance must be a name, got {self.acceptance!r}"
        return None

    # -- what the step says about the event -------------------------------------------------
    @property
    def decode_reader(self) -> Phase:
        """The decode sequence's last reader of the shared buffers."""
        return _last_reader(self.decode)

    @property
    def prefill_reader(self) -> Phase:
        return _last_reader(self.prefill)

    @property
    def owner(self) -> Runner:
        """The runner that owns the step's read-done event."""
        return self.decode_reader.runner

    @property
    def publish_modes(self) -> frozenset[ForwardMode]:
        """The modes whose forward is the step's last shared reader (the publish phases)."""
        modes = {self.decode_reader.mode}
        if self.prefill_reader.runner == self.owner:
            modes.add(self.prefill_reader.mode)
        return frozenset(modes & PUBLISHING_MODES)

    @property
    def prefill_reads_later(self) -> bool:
        """The prefill's last shared reader runs on another runner than its first forward
        (EAGLE's draft prompt pass after the target's ``EXTEND``): the prefill runner may
        publish early only for a batch whose later reads the algorithm staged (sglang #38554,
        :attr:`~warcore.AlgorithmSpec.prefill_shared_read_stager`)."""
        return self.prefill_reader.runner != self.prefill[0].runner

    @property
    def has_draft_model(self) -> bool:
        return any(p.runner == "draft" for p in (*self.prefill, *self.decode))

    @property
    def speculative(self) -> bool:
        """The target verifies drafts (``TARGET_VERIFY``) rather than decoding one token."""
        return any(
            p.runner == "target" and p.mode is ForwardMode.TARGET_VERIFY for p in self.decode
        )

    def describe(self) -> str:
        """``prefill: target EXTEND*; decode: draft DECODE xnum_draft -> target TARGET_VERIFY*``
        (``*``: the last reader)."""

        def seq(phases: tuple[Phase, ...], reader: Phase) -> str:
            return " -> ".join(
                p.describe() + ("*" if p is reader and not p.last_reader else "") for p in phases
            )

        text = (
            f"prefill: {seq(self.prefill, self.prefill_reader)}; "
            f"decode: {seq(self.decode, self.decode_reader)}"
        )
        return text + (" -> propose" if self.propose else "")


def _last_reader(phases: tuple[Phase, ...]) -> Phase:
    return next((p for p in phases if p.last_reader), phases[-1])
