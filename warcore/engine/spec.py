"""Speculative-decoding workers: the forwards one step of each algorithm family launches.

Every step ends with the target's ``commit`` (the rows advance past what the step accepted);
the worker's ``mailbox`` is the runner that owns the step's read-done event (the step's last
reader of the shared buffers), as the algorithm answers ``warcore_step_event_owner`` for this
worker's facts; the scheduler's barrier takes that runner's event (``None``: no owner, coarse):

* ``none``:   target forward, commit.                                   mailbox: target
* ``dflash``: target forward (prefill or verify), commit, block drafter. mailbox: target
* ``eagle``:  k draft decodes, target verify, draft-extend, commit.     mailbox: draft
  (prefill: target prefill, draft prefill over the prompt, commit)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import torch

from warcore.core import ForwardMode, StepFacts
from warcore.runners import ModelRunner, RowState, RunnerGroup, StepInput, StepOutput
from warcore.runners.batch import ForwardBatch

__all__ = ["DflashWorker", "EagleWorker", "PlainWorker", "Worker"]


class Worker(Protocol):
    @property
    def mailbox(self) -> ModelRunner | None: ...

    def launch(self, step: StepInput) -> StepOutput:
        """Launch every forward of one step on the forward stream; the target's output."""
        ...


def feed_inputs(state: RowState) -> Callable[[ForwardBatch], None]:
    """Decode / verify input: the row's next token, then the drafter's proposals."""

    def fill(fb: ForwardBatch) -> None:
        rows = fb.req_pool_indices
        fb.input_ids[:, 0].copy_(state.token[rows])
        if fb.max_q > 1:
            fb.input_ids[:, 1:].copy_(state.drafts[rows, : fb.max_q - 1])

    return fill


class PlainWorker:
    facts = StepFacts(has_draft_model=False)
    """What this worker tells the algorithm's event-owner answer about the rank and the step."""

    def __init__(self, target: RunnerGroup) -> None:
        self.target = target

    @property
    def mailbox(self) -> ModelRunner | None:
        """The owner's runner: a lookup, resolved once per plugin set."""
        r = self.target.runner
        return self.runner_named(r.decisions.event_owner(r.context.algorithm, self.facts).owner)

    def runner_named(self, owner: str | None) -> ModelRunner | None:
        return self.target.runner if owner == "target" else None

    def _target(self, step: StepInput) -> StepOutput:
        if step.prompt_ids is None:
            step = replace(step, fill=feed_inputs(self.target.runner.rows))
        return self.target.run(step)

    def launch(self, step: StepInput) -> StepOutput:
        out = self._target(step)
        self.target.runner.commit(out)
        return out


class BlockDrafter(Protocol):
    def propose(self, rows: torch.Tensor, state: RowState) -> None: ...


class DflashWorker(PlainWorker):
    """Verify the block, commit, then draft the next block from the committed hidden state."""

    def __init__(self, target: RunnerGroup, drafter: BlockDrafter) -> None:
        super().__init__(target)
        self.drafter = drafter

    def launch(self, step: StepInput) -> StepOutput:
        out = super().launch(step)
        r, drafter, bs = self.target.runner, self.drafter, step.batch_size
        rows = out.batch.req_pool_indices
        with r.device.use_stream(r.forward_stream):
            r.device.launch(lambda: drafter.propose(rows[:bs], r.rows), "draft_block")
        return out


class EagleWorker(PlainWorker):
    """EAGLE: an autoregressive drafter with its own KV, and a draft-extend after verify."""

    def __init__(self, target: RunnerGroup, draft: RunnerGroup, num_draft: int) -> None:
        super().__init__(target)
        self.draft = draft
        self.num_draft = num_draft
        cfg = draft.runner.model.cfg
        self.draft_hidden = torch.zeros(
            draft.runner.pool.max_reqs,
            cfg.hidden,
            dtype=cfg.dtype,
            device=draft.runner.device.torch_device,
        )

    facts = StepFacts(has_draft_model=True)

    def runner_named(self, owner: str | None) -> ModelRunner | None:
        return self.draft.runner if owner == "draft" else super().runner_named(owner)

    def launch(self, step: StepInput) -> StepOutput:
        if step.prompt_ids is not None:
            out = self._target(step)
            self.draft.run(
                replace(
                    step, forward_mode=ForwardMode.DRAFT_EXTEND, fill=self._prompt_features(out)
                )
            )
        else:
            for j in range(self.num_draft):
                self._draft_decode(step, j)
            out = self._target(step)
            self.draft.run(
                replace(
                    step, forward_mode=ForwardMode.DRAFT_EXTEND_V2, fill=self._verify_inputs(out)
                )
            )
        self.target.runner.commit(out)
        return out

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
        r = self.draft.runner
        tokens, hidden, _ = r.outputs(out.batch)
        rows = out.batch.req_pool_indices

        def keep() -> None:
            state.drafts[rows[:bs], j] = tokens[:bs, 0]
            prev[rows[:bs]] = hidden[:bs, 0]

        with r.device.use_stream(r.forward_stream):
            r.device.launch(keep, f"keep_draft{j}")


def build_drafter(spec_drafter: Callable[..., Any] | None, name: str, *args: Any) -> Any:
    if spec_drafter is None:
        raise ValueError(f"algorithm {name!r} offers no drafter for the reference engine")
    return spec_drafter(*args)
