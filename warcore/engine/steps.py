"""What the reference engine runs of a step (:class:`~warcore.StepSpec`), and the built-in
families' steps.

The core describes a step; this is the engine's policy over it: the built-in families' steps
(:data:`NONE_STEP`, :data:`EAGLE_STEP`, :data:`DFLASH_STEP`, by family in
:data:`FAMILY_STEPS`), the step an algorithm runs (:func:`step_of`) and why the engine cannot
run one (:func:`engine_problem`). Imports only the core (no torch): ``warcore check`` uses it.

What the reference engine runs:

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

from warcore.core import NUM_DRAFT, AlgorithmSpec, ForwardMode, Phase, StepSpec

__all__ = [
    "ACCEPTANCE_RULES",
    "DFLASH_STEP",
    "EAGLE_STEP",
    "FAMILY_STEPS",
    "NONE_STEP",
    "engine_problem",
    "prefill_staging",
    "records_per_step",
    "step_of",
]

ACCEPTANCE_RULES = ("greedy_prefix",)
"""``greedy_prefix``: the longest prefix of drafts equal to the target's own greedy tokens, plus
one bonus token (lossless: the tokens are those of plain greedy decoding)."""

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


STAGES = "stages"
NO_STAGER = "none: prefill coarse"
NOT_NEEDED = "not needed"


def prefill_staging(spec: AlgorithmSpec) -> str:
    """What an algorithm's staging hook (``AlgorithmSpec.prefill_shared_read_stager``, sglang
    #38554) answers for its prefill, as ``warcore matrix`` and ``warcore check`` show it:

    * ``stages``: its prefill reads the shared buffers later on another runner and it offers
      a stager: a batch the stager staged publishes early (for a ``PRE_REPLAY`` backend);
    * ``none: prefill coarse``: its prefill reads later and it offers no stager, so its
      prefill keeps the coarse fence (sglang's default for custom algorithms);
    * ``not needed``: its prefill is its own last reader (no stager is ever called);
    * ``-``: no step the reference engine knows.
    """
    step = step_of(spec)
    if step is None:
        return "-"
    if not step.prefill_reads_later:
        return NOT_NEEDED
    return STAGES if spec.prefill_shared_read_stager is not None else NO_STAGER


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


def records_per_step(step: StepSpec, runner: str, num_draft: int) -> int:
    """The most read-done records ``runner`` can issue in one step of ``step``: one per
    forward it runs (an upper bound: a forward publishes at most once), the larger of the
    prefill and the decode step; at least 1."""

    def count(phases: tuple[Phase, ...]) -> int:
        return sum(
            num_draft if p.repeat == NUM_DRAFT else int(p.repeat)
            for p in phases
            if p.runner == runner
        )

    return max(1, count(step.prefill), count(step.decode))
