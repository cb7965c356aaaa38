"""Steps as data: the forwards one step of a speculative algorithm runs (DESIGN §9).

An algorithm plugin describes its step with a :class:`StepSpec` on its
:class:`~warcore.AlgorithmSpec` (``step=``): which forwards run, in what order, on which runner
(the ``target`` model or the ``draft`` model), which of them is the step's last reader of the
scheduler-shared buffers (and so owns the read-done event), whether a drafter proposes the next
drafts after the commit, and how drafts are accepted. The built-in families are three uses of
it (:data:`NONE_STEP`, :data:`EAGLE_STEP`, :data:`DFLASH_STEP`)::

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

What the reference engine runs (:func:`engine_problem` says why it cannot run a step):

========  ===================  ==========================================================
runner    mode                 the phase
========  ===================  ==========================================================
target    ``EXTEND``           prefill, first: the prompt; samples the first token
draft     ``DRAFT_EXTEND``     prefill, after the target: the draft model over the prompt
                               (its input features: the target's hidden states)
draft     ``DECODE``           decode, before the target (``repeat="num_draft"``): the
                               draft chain; step ``j`` writes draft ``j`` of each row
target    ``TARGET_VERIFY``    decode: the row's next token and its ``k`` drafts, verified
target    ``DECODE``           decode without drafts (no speculation)
draft     ``DRAFT_EXTEND_V2``  decode, after the target: redoes the draft model's KV over
                               the verified positions with the target's hidden states
========  ===================  ==========================================================

Every step ends with the target's commit (each row advances past what it accepted); with
``propose=True`` the algorithm's drafter (:class:`warcore.engine.drafter.Drafter`) then writes
the next step's drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ._modes import ForwardMode

if TYPE_CHECKING:
    from ._specs import AlgorithmSpec

__all__ = [
    "ACCEPTANCE_RULES",
    "DFLASH_STEP",
    "EAGLE_STEP",
    "FAMILY_STEPS",
    "NONE_STEP",
    "NUM_DRAFT",
    "PUBLISHING_MODES",
    "Phase",
    "StepSpec",
    "engine_problem",
    "step_of",
]

Runner = Literal["target", "draft"]
RUNNERS: tuple[Runner, ...] = ("target", "draft")

NUM_DRAFT: Literal["num_draft"] = "num_draft"
"""``Phase.repeat``: as many times as the engine's draft tokens per verify."""

ACCEPTANCE_RULES = ("greedy_prefix",)
"""``greedy_prefix``: the longest prefix of drafts equal to the target's own greedy tokens, plus
one bonus token (lossless: the tokens are those of plain greedy decoding)."""

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
    the commit (dflash, n-gram); ``acceptance``: how drafts are accepted
    (:data:`ACCEPTANCE_RULES`). :class:`~warcore.AlgorithmSpec` checks the spec when it is
    built and raises ``ValueError`` naming the algorithm and the problem (:meth:`problem`).
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


_EXTEND = Phase("target", ForwardMode.EXTEND)

NONE_STEP = StepSpec(decode=(Phase("target", ForwardMode.DECODE),), prefill=(_EXTEND,))
"""No speculation: the target decodes; the target owns the event."""

EAGLE_STEP = StepSpec(
    prefill=(_EXTEND, Phase("draft", ForwardMode.DRAFT_EXTEND)),
    decode=(
        Phase("draft", ForwardMode.DECODE, repeat=NUM_DRAFT),
        Phase("target", ForwardMode.TARGET_VERIFY),
        Phase("draft", ForwardMode.DRAFT_EXTEND_V2),
    ),
)
"""EAGLE: k draft decodes, the target verify, the draft-extend after it (the last reader: the
draft runner owns the event). Its prefill ends with the draft's prompt pass, a mode no runner
publishes: a prefill step keeps the coarse fence."""

DFLASH_STEP = StepSpec(
    prefill=(_EXTEND,), decode=(Phase("target", ForwardMode.TARGET_VERIFY),), propose=True
)
"""dflash/dspark: the target verifies the block (the last reader), commits, and the block
drafter proposes the next block; the target owns the event."""

FAMILY_STEPS: dict[str, StepSpec] = {"none": NONE_STEP, "eagle": EAGLE_STEP, "dflash": DFLASH_STEP}
"""The step of an :class:`~warcore.AlgorithmSpec` that gives a built-in ``family`` and no
``step`` (before steps were data, the family named the shape)."""


def step_of(spec: AlgorithmSpec) -> StepSpec | None:
    """The step an algorithm runs: its own ``step``, else its family's, else ``None``."""
    return spec.step if spec.step is not None else FAMILY_STEPS.get(spec.family)


# -- what the reference engine can run ----------------------------------------------------

_DRAFT_PREFILL = ForwardMode.DRAFT_EXTEND
_TARGET_DECODE = frozenset({ForwardMode.TARGET_VERIFY, ForwardMode.DECODE})


def engine_problem(spec: AlgorithmSpec) -> str | None:
    """Why warcore's reference engine cannot run ``spec`` (``None``: it can).

    ``warcore check`` reports it, ``warcore sanitize`` skips the algorithm with it and
    ``warcore run`` refuses with it.
    """
    step = step_of(spec)
    if step is None:
        return (
            f"its family {spec.family!r} is none of the built-in step shapes "
            f"({', '.join(FAMILY_STEPS)}) and it declares no step "
            "(give its AlgorithmSpec a step=warcore.StepSpec(...))"
        )
    problem = _step_problem(step)
    if problem is not None:
        return problem
    if (step.has_draft_model or step.propose) and spec.drafter is None:
        what = "a draft model" if step.has_draft_model else "a drafter that proposes"
        return f"its step needs {what}, but its AlgorithmSpec has no drafter factory"
    return None


def _step_problem(step: StepSpec) -> str | None:
    if step.acceptance not in ACCEPTANCE_RULES:
        return (
            f"acceptance {step.acceptance!r}: the reference engine accepts "
            f"{', '.join(ACCEPTANCE_RULES)} only"
        )
    first, *rest = step.prefill
    if (first.runner, first.mode, first.repeat) != ("target", ForwardMode.EXTEND, 1):
        return f"its prefill must start with the target's EXTEND, not {first.describe()}"
    for p in rest:
        if (p.runner, p.mode, p.repeat) != ("draft", _DRAFT_PREFILL, 1):
            return (
                f"prefill phase {p.describe()}: after the target's EXTEND the reference engine "
                "runs only the draft model's DRAFT_EXTEND (once)"
            )
    if len(rest) > 1:
        return "its prefill runs the draft model's DRAFT_EXTEND more than once"
    targets = [i for i, p in enumerate(step.decode) if p.runner == "target"]
    if len(targets) != 1:
        return f"its decode step must run exactly one target forward, not {len(targets)}"
    verify = step.decode[targets[0]]
    if verify.mode not in _TARGET_DECODE or verify.repeat != 1:
        return (
            f"decode phase {verify.describe()}: the target runs TARGET_VERIFY (with drafts) or "
            "DECODE (without), once"
        )
    before, after = step.decode[: targets[0]], step.decode[targets[0] + 1 :]
    for p in before:
        if (p.runner, p.mode) != ("draft", ForwardMode.DECODE):
            return f"decode phase {p.describe()}: before the verify only draft DECODE runs"
    if len(before) > 1:
        return "its decode step has more than one draft DECODE phase (use repeat)"
    for p in after:
        if (p.runner, p.mode, p.repeat) != ("draft", ForwardMode.DRAFT_EXTEND_V2, 1):
            return (
                f"decode phase {p.describe()}: after the verify only the draft's "
                "DRAFT_EXTEND_V2 runs (once)"
            )
    if len(after) > 1:
        return "its decode step runs DRAFT_EXTEND_V2 more than once"
    chain = bool(before)
    if verify.mode is ForwardMode.TARGET_VERIFY and chain == step.propose:
        return (
            "its verify needs exactly one source of drafts: a draft DECODE chain before it, "
            "or propose=True (a drafter after the commit)"
            if not chain
            else "its drafts come from both a draft DECODE chain and a proposing drafter"
        )
    if verify.mode is ForwardMode.DECODE and (step.has_draft_model or step.propose):
        return "its target DECODEs without drafts, so it can have no draft model or drafter"
    if step.has_draft_model and step.propose:
        return "it has both a draft model and a proposing drafter; the engine builds one"
    return None
