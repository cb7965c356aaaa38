"""The speculative worker: one generic interpreter of an algorithm's :class:`~warcore.StepSpec`.

A step's forwards are data (``warcore/core/_steps.py``); :class:`StepWorker` launches them in
order on the forward stream, then the target's ``commit`` (each row advances past what it
accepted), then, for ``propose=True``, the algorithm's drafter. The built-in families are three
steps::

    none:    prefill target EXTEND*                      decode target DECODE*
    dflash:  prefill target EXTEND*                      decode target TARGET_VERIFY* -> propose
    eagle:   prefill target EXTEND -> draft DRAFT_EXTEND decode draft DECODE x k ->
                                                                target TARGET_VERIFY ->
                                                                draft DRAFT_EXTEND_V2*

(``*``: the last shared reader, whose runner owns the step's read-done event.) The worker's
``mailbox`` is that owner's runner, as the algorithm answers ``warcore_step_event_owner`` for
the worker's ``facts`` (the step's own owner when no plugin answers); the scheduler's barrier
takes that runner's event (``None``: no owner, the coarse fence).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from warcore.batch import ForwardBatch, RowState, StepInput
from warcore.core import (
    NUM_DRAFT,
    ForwardMode,
    Phase,
    StepFacts,
    StepSpec,
    last_shared_read_runner,
)
from warcore.engine.drafter import Drafter, DrafterError, DraftInput, TokenHistory, check_drafts
from warcore.runners import ModelRunner, RunnerGroup, StepOutput

__all__ = ["StepWorker", "Worker", "build_drafter", "feed_inputs", "stage_draft_extend"]


class Worker(Protocol):
    @property
    def mailbox(self) -> ModelRunner | None: ...

    def launch(self, step: StepInput) -> StepOutput:
        """Launch every forward of one step on the forward stream; the target's output."""
        ...


def feed_inputs(state: RowState) -> Callable[[ForwardBatch], None]:
    """Decode / verify input: the row's next token, then the drafts."""

    def fill(fb: ForwardBatch) -> None:
        rows = fb.req_pool_indices
        fb.input_ids[:, 0].copy_(state.token[rows])
        if fb.max_q > 1:
            fb.input_ids[:, 1:].copy_(state.drafts[rows, : fb.max_q - 1])

    return fill


class StepWorker:
    """Runs one algorithm's step, as its :class:`~warcore.StepSpec` describes it.

    ``target``/``draft``: the runner groups (``draft`` only for a step with draft phases);
    ``drafter``: the proposing drafter (only for ``propose=True``); ``num_draft``: the drafts
    per verify (0 without speculation); ``owner``: who the drafter is, for its problems
    (``algorithm 'x' (plugin 'y')``).

    The drafter is held to its contract here (``warcore/engine/drafter.py``): after each
    ``propose`` the rows' drafts are checked on the device (an invalid one becomes token 0),
    and a drafter method that raises is recorded, not propagated; :meth:`drafter_problems`
    says what happened.
    """

    def __init__(
        self,
        algorithm: str,
        spec: StepSpec,
        target: RunnerGroup,
        *,
        num_draft: int,
        draft: RunnerGroup | None = None,
        drafter: Drafter | None = None,
        max_context: int = 0,
        owner: str = "",
    ) -> None:
        self.algorithm = algorithm
        self.owner = owner or f"algorithm {algorithm!r}"
        self.spec = spec
        self.target = target
        self.draft = draft
        self.drafter = drafter
        self.num_draft = num_draft
        self.facts = StepFacts(has_draft_model=draft is not None)
        """What this worker tells the algorithm's event-owner answer about the rank and step."""
        r = target.runner
        self.history = (
            None
            if drafter is None
            else TokenHistory(r.pool.max_reqs, max_context, r.device.torch_device)
        )
        self.draft_hidden: torch.Tensor | None = None
        if draft is not None:
            cfg = draft.runner.model.cfg
            self.draft_hidden = torch.zeros(
                draft.runner.pool.max_reqs,
                cfg.hidden,
                dtype=cfg.dtype,
                device=draft.runner.device.torch_device,
            )
        self.admitted: dict[int, int] = {}
        """Row -> request id of the requests the drafter was told about (host side)."""
        self.vocab_size = r.model.cfg.vocab_size
        self._invalid_drafts = torch.zeros((), dtype=torch.int64, device=r.device.torch_device)
        """Drafts replaced at the contract boundary since :meth:`reset_problems` (device)."""
        self._raised: dict[str, tuple[int, str]] = {}
        """Drafter method -> (calls that raised, what the first raised); stream work."""

    # -- the event owner --------------------------------------------------------------------
    _owner_cache: object = None
    _owner_generation = -1
    _owner: str | None = None
    prefill_staged = False
    """The step launched last was a prefill whose later shared reads were staged, so its
    target published early: that step's barrier takes the target's event (sglang #38169)."""

    @property
    def mailbox(self) -> ModelRunner | None:
        """The runner whose event the barrier takes after the step launched last: the owner's,
        resolved once per plugin set (the barrier asks every step: an attribute check while
        nothing changed), or the target's on a staged prefill step."""
        r = self.target.runner
        decisions = r.decisions
        generation = decisions.pm.generation  # read before resolving: a change re-resolves
        if self._owner_cache is not decisions or self._owner_generation != generation:
            self._owner = decisions.event_owner(r.context.algorithm, self.facts).owner
            self._owner_cache, self._owner_generation = decisions, generation
        return self.runner_named(
            last_shared_read_runner(self._owner, prefill_staged=self.prefill_staged)
        )

    def runner_named(self, owner: str | None) -> ModelRunner | None:
        if owner == "target":
            return self.target.runner
        if owner == "draft" and self.draft is not None:
            return self.draft.runner
        return None

    # -- one step ---------------------------------------------------------------------------
    def launch(self, step: StepInput) -> StepOutput:
        prefill = step.prompt_ids is not None
        if self.drafter is not None and prefill:
            self._admit(step)
        out: StepOutput | None = None
        for phase in self.spec.prefill if prefill else self.spec.decode:
            out = self._phase(phase, step, out)
        assert out is not None  # a runnable step always runs the target
        # Its target published before the draft's prompt pass only if the stager staged it.
        self.prefill_staged = (
            prefill and self.spec.prefill_reads_later and out.record_point.publishes
        )
        r = self.target.runner
        r.commit(out)
        if self.history is not None and self.drafter is not None:
            history, state, drafter = self.history, r.rows, self.drafter
            self._launch(lambda: history.record(out, state), "record_history")
            if self.spec.propose:
                self._propose(step, out, drafter, history)
        return out

    def _phase(self, phase: Phase, step: StepInput, target: StepOutput | None) -> StepOutput | None:
        """Run ``phase``; the target's output (the one the step returns) so far."""
        mode = phase.mode
        if phase.runner == "target":
            if step.prompt_ids is None:
                return self.target.run(replace(step, fill=feed_inputs(self.target.runner.rows)))
            return self.target.run(step)
        assert self.draft is not None
        if mode is ForwardMode.DRAFT_EXTEND:  # the draft model's pass over the prompt
            assert target is not None
            self.draft.run(replace(step, forward_mode=mode, fill=self._prompt_features(target)))
        elif mode is ForwardMode.DECODE:  # the draft chain
            repeat = self.num_draft if phase.repeat == NUM_DRAFT else int(phase.repeat)
            for j in range(repeat):
                self._draft_decode(step, j)
        elif mode is ForwardMode.DRAFT_EXTEND_V2:  # redo the draft KV of the verified block
            assert target is not None
            self.draft.run(replace(step, forward_mode=mode, fill=self._verify_inputs(target)))
        else:  # engine_problem() refuses every other phase before a worker is built
            raise ValueError(f"the reference engine cannot run phase {phase.describe()}")
        return target

    # -- stage, then publish ----------------------------------------------------------------
    def stage_draft_extend(self, batch: ForwardBatch) -> bool:
        """EAGLE's ``prefill_shared_read_stager`` (sglang #38554, #35126): launch the shared
        reads of the step's draft ``DRAFT_EXTEND`` now, before the target's prefill records its
        read-done event: the draft runner's ``load_batch`` (the prompt's slots from
        ``req_to_token``) and its backend's metadata init, into the draft's private batch and
        metadata. The draft's forward then reads only those copies (with a backend whose
        prompt-pass layers read only its metadata, as the built-in ones'; ``warcore sanitize``
        checks it). ``False`` for a batch it cannot stage (no draft prompt pass)."""
        draft, host = self.draft, batch.host
        if (
            draft is None
            or host is None
            or batch.forward_mode is not ForwardMode.EXTEND
            or not any(
                p.runner == "draft" and p.mode is ForwardMode.DRAFT_EXTEND
                for p in self.spec.prefill
            )
        ):
            return False
        draft.stage(replace(host, forward_mode=ForwardMode.DRAFT_EXTEND, fill=None))
        return True

    def _prompt_features(self, target: StepOutput) -> Callable[[ForwardBatch], None]:
        """Position p of the prompt gets the target hidden state of position p - 1."""
        _, hidden, _ = self.target.runner.outputs(target.batch)

        def fill(fb: ForwardBatch) -> None:
            fb.features[:, 0].zero_()
            fb.features[:, 1:].copy_(hidden[:, :-1])

        return fill

    def _verify_inputs(self, target: StepOutput) -> Callable[[ForwardBatch], None]:
        """Redo the draft KV of the verified positions with the target's real hidden states."""
        state, bs = self.target.runner.rows, target.step.batch_size
        tgt = target.batch
        _, hidden, _ = self.target.runner.outputs(tgt)

        def fill(fb: ForwardBatch) -> None:
            rows = fb.req_pool_indices[:bs]
            fb.input_ids[:bs].copy_(tgt.input_ids[:bs])
            fb.features[:bs, 0].copy_(state.feature[rows])
            fb.features[:bs, 1:].copy_(hidden[:bs, :-1])

        return fill

    def _draft_decode(self, step: StepInput, j: int) -> None:
        """Draft step ``j``: the row's next token (``j = 0``) or draft ``j - 1``, with the
        target's (or the previous draft step's) hidden state as its feature; keeps draft ``j``."""
        assert self.draft is not None and self.draft_hidden is not None
        state, prev = self.target.runner.rows, self.draft_hidden
        bs = step.batch_size

        def fill(fb: ForwardBatch) -> None:
            rows = fb.req_pool_indices
            if j == 0:
                fb.input_ids[:, 0].copy_(state.token[rows])
                fb.features[:, 0].copy_(state.feature[rows])
            else:
                fb.input_ids[:, 0].copy_(state.drafts[rows, j - 1])
                fb.features[:, 0].copy_(prev[rows])

        draft_step = StepInput(ForwardMode.DECODE, step.rows, [1] * bs, 1, offset=j, fill=fill)
        out = self.draft.run(draft_step)
        tokens, hidden, _ = self.draft.runner.outputs(out.batch)
        rows = out.batch.req_pool_indices

        def keep() -> None:
            state.drafts[rows[:bs], j] = tokens[:bs, 0]
            prev[rows[:bs]] = hidden[:bs, 0]

        self._launch(keep, f"keep_draft{j}")

    # -- the drafter ------------------------------------------------------------------------
    def _admit(self, step: StepInput) -> None:
        """Stream work: tell the drafter which request enters which row (releasing a row's
        previous request first, should the engine not have said)."""
        assert step.prompt_ids is not None and self.drafter is not None
        drafter, r = self.drafter, self.target.runner
        ids = _request_ids(step)
        entries = [
            (row, rid, list(prompt[:n]))
            for row, rid, prompt, n in zip(
                step.rows, ids, step.prompt_ids, step.q_lens, strict=True
            )
        ]
        stale = [row for row, _, _ in entries if row in self.admitted]
        for row, rid, _ in entries:
            self.admitted[row] = rid

        def admit() -> None:
            for row in stale:
                self._call("release", drafter.release, row)
            for row, rid, prompt in entries:
                self._call("admit", drafter.admit, row, rid, prompt)

        with r.device.use_stream(r.forward_stream):
            r.device.launch(admit, "drafter_admit")

    def release(self, rows: Sequence[int]) -> None:
        """Stream work: the requests in ``rows`` are gone (the engine calls this before the
        next step it launches, and with every admitted row when a run ends)."""
        drafter = self.drafter
        gone = [row for row in rows if self.admitted.pop(row, None) is not None]
        if drafter is None or not gone:
            return
        r = self.target.runner

        def release() -> None:
            for row in gone:
                self._call("release", drafter.release, row)

        with r.device.use_stream(r.forward_stream):
            r.device.launch(release, "drafter_release")

    def release_all(self) -> None:
        self.release(list(self.admitted))

    def _propose(
        self, step: StepInput, out: StepOutput, drafter: Drafter, history: TokenHistory
    ) -> None:
        r, bs = self.target.runner, step.batch_size
        rows, state = out.batch.req_pool_indices, r.rows
        host_rows, ids = tuple(step.rows), _request_ids(step)
        host = drafter.location == "host"
        mode, k, vocab = out.step.forward_mode, self.num_draft, self.vocab_size

        def propose() -> None:
            live = rows[:bs]
            committed = history.committed(live, state) if host else None
            batch = DraftInput(
                mode, k, live, host_rows, ids, state, history.tokens, committed, vocab
            )
            self._call("propose", drafter.propose, batch)
            drafts = state.drafts[live, :k]
            self._invalid_drafts += check_drafts(drafts, vocab)
            state.drafts[live, :k] = drafts

        self._launch(propose, "draft_propose")

    def _call(self, method: str, fn: Callable[..., object], *args: Any) -> None:
        """A drafter method, isolated: what it raises is recorded (stream work)."""
        try:
            fn(*args)
        except Exception as exc:
            n, first = self._raised.get(method, (0, f"{type(exc).__name__}: {exc}"))
            self._raised[method] = (n + 1, first)

    def _launch(self, fn: Callable[[], object], label: str) -> None:
        """Step work after the forwards, on the forward stream, through the target runner's
        probe when one is installed (the read tracer sees its reads)."""
        r = self.target.runner
        if r.probe is not None:
            fn = r.probe.wrap(r, label, fn)
        with r.device.use_stream(r.forward_stream):
            r.device.launch(fn, label)

    # -- the drafter's problems -------------------------------------------------------------
    def reset_problems(self) -> None:
        """Start counting afresh (stream work, in order with the steps; the engine calls it at
        the start of a run)."""
        r = self.target.runner
        with r.device.use_stream(r.forward_stream):
            r.device.launch(self._invalid_drafts.zero_, "drafter_reset")
        self._raised = {}

    def drafter_problems(self) -> dict[str, str]:
        """How the drafter broke its contract since :meth:`reset_problems`: by kind
        (``invalid-drafts``, or the method that raised), one line each naming :attr:`owner`.
        Reads a device counter: call it after the forward stream finished (the engine does,
        at the end of a run)."""
        if self.drafter is None:
            return {}
        problems = {}
        invalid = int(self._invalid_drafts.item())
        if invalid:
            problems["invalid-drafts"] = (
                f"{self.owner}: its drafter proposed {invalid} draft token(s) outside the "
                f"vocabulary (valid: 0..{self.vocab_size - 1}); token 0 was verified in their "
                "place (a wrong draft costs acceptance, never correctness)"
            )
        for method, (n, first) in sorted(self._raised.items()):
            problems[method] = (
                f"{self.owner}: its drafter's {method}() raised {n} time(s), first {first}; "
                "the step went on with the drafts as they were (any draft is safe)"
            )
        return problems


def stage_draft_extend(worker: StepWorker) -> Callable[[ForwardBatch], bool]:
    """The ``prefill_shared_read_stager`` factory of the built-in ``eagle`` (and of any
    algorithm whose prefill is the target's ``EXTEND`` then the draft's ``DRAFT_EXTEND``):
    :meth:`StepWorker.stage_draft_extend` of the engine's worker."""
    return worker.stage_draft_extend


def _request_ids(step: StepInput) -> tuple[int, ...]:
    ids = step.request_ids
    return tuple(ids) if ids is not None else (-1,) * step.batch_size


def build_drafter(spec_drafter: Callable[..., Any] | None, owner: str, *args: Any) -> Any:
    """What the algorithm's drafter factory returns; :class:`DrafterError` naming ``owner``
    (``algorithm 'x' (plugin 'y')``) when it has none, raises, or returns ``None``."""
    if spec_drafter is None:
        raise DrafterError(f"{owner} offers no drafter for the reference engine")
    try:
        made = spec_drafter(*args)
    except Exception as exc:
        raise DrafterError(
            f"{owner}: its drafter factory raised {type(exc).__name__}: {exc}"
        ) from exc
    if made is None:
        raise DrafterError(f"{owner}: its drafter factory returned None")
    return made
