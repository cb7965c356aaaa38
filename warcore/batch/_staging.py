"""Persistent host staging buffers: a ring of pinned host tensors for each forward's inputs.

Real engines stage a step's host inputs (rows, query lengths, prompt tokens) through
persistent pinned buffers and copy them to the device with non-blocking copies on the forward
stream; a host-to-device copy reads its source when it *executes*, not when it is enqueued
(TensorRT-LLM #15546, #16088). So a buffer may be rewritten only once the forward that reads
it is past its reads. Two shapes:

* guarded (vLLM V1's ``prepare_inputs_event``): each slot keeps the event that releases it (the
  forward's read-done event when that covers its host reads, else its done event); staging
  into a slot whose event is not reached waits for it on the host (counted in ``stalls``);
* depth only (vLLM V2's pinned ring "at least the number of in-flight steps" deep): no event;
  correct only when ``depth >= required``.

The depth the engine derives (:func:`staging_depth`) makes a guarded ring never wait in steady
state: the slot it reuses belongs to a step the host has already collected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from warcore.batch._forward import StagedInputs

if TYPE_CHECKING:
    from warcore.batch._forward import StepInput

__all__ = ["HostStaging", "StagedInputs", "staging_depth"]


def staging_depth(forwards_per_step: int, steps_in_flight: int = 1, after_collect: int = 0) -> int:
    """Ring depth for a runner launching up to ``forwards_per_step`` forwards a step, with
    ``steps_in_flight`` steps launched and not yet collected when the host stages the next
    one (1 for the overlap loop), and ``after_collect`` of its forwards launched after the
    output the host collects a step by (EAGLE's draft-extend after the verify): the slot a new
    forward takes was last used by a forward the host has waited for."""
    if forwards_per_step < 1 or steps_in_flight < 0 or after_collect < 0:
        raise ValueError(
            f"staging depth needs forwards_per_step >= 1, steps_in_flight >= 0 and "
            f"after_collect >= 0, got {forwards_per_step}, {steps_in_flight} and {after_collect}"
        )
    return (steps_in_flight + 1) * forwards_per_step + after_collect


class HostStaging:
    """A ring of :class:`StagedInputs` (see the module docstring).

    ``fresh=True`` allocates new host tensors for every forward instead (the reference
    engine's old behaviour, kept for ``warcore bench overlap``'s comparison): nothing is
    reused, so nothing needs a guard.
    """

    def __init__(
        self,
        max_bs: int,
        capacity: int,
        depth: int,
        *,
        pin: bool = False,
        guarded: bool = True,
        required: int | None = None,
        fresh: bool = False,
    ) -> None:
        if depth < 1:
            raise ValueError(f"host staging ring depth must be >= 1, got {depth}")
        self.max_bs, self.capacity, self.pin = max_bs, capacity, pin
        self.depth = depth
        self.guarded = guarded
        self.required = depth if required is None else required
        """The depth a depth-only ring needs (:func:`staging_depth` of the engine's step)."""
        self.fresh = fresh
        self.slots = (
            [] if fresh else [StagedInputs.empty(i, max_bs, capacity, pin) for i in range(depth)]
        )
        self._next = 0
        self.staged = 0
        self.stalls = 0
        """Stagings that found their slot's release event not yet reached (and waited)."""

    @property
    def sound(self) -> bool:
        """Whether reuse is ordered after the reads: fresh, guarded, or deep enough."""
        return self.fresh or self.guarded or self.depth >= self.required

    def stage(self, step: StepInput) -> StagedInputs:
        """Write ``step``'s host inputs into the next slot (host work, now) and return it."""
        bs, mq = step.batch_size, step.max_q
        if self.fresh:
            slot = self._fresh(step)
        else:
            slot = self.slots[self._next]
            self._next = (self._next + 1) % self.depth
            event = slot.release
            if self.guarded and event is not None and not event.query():
                self.stalls += 1
                event.synchronize()
            slot.release = None
            slot.rows[:bs].copy_(torch.tensor(step.rows, dtype=torch.int64))
            slot.q_lens[:bs].copy_(torch.tensor(step.q_lens, dtype=torch.int64))
            if step.prompt_ids is not None:
                flat = torch.tensor(step.prompt_ids, dtype=torch.int64).view(-1)
                slot.prompt[: flat.numel()].copy_(flat)
        slot.batch_size, slot.max_q = bs, mq
        slot.has_prompt = step.prompt_ids is not None
        self.staged += 1
        return slot

    def _fresh(self, step: StepInput) -> StagedInputs:
        def t(data: list[int] | list[list[int]]) -> torch.Tensor:
            tensor = torch.tensor(data, dtype=torch.int64)
            return tensor.pin_memory() if self.pin else tensor

        prompt = t(step.prompt_ids).view(-1) if step.prompt_ids is not None else t([])
        return StagedInputs(-1, t(step.rows), t(step.q_lens), prompt)

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every slot's tensors by name (``staging[i].rows``), for the read tracer."""
        return {
            f"staging[{slot.index}].{name}": t
            for slot in self.slots
            for name, t in slot.buffers().items()
        }
