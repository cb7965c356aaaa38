"""The steps the audit hands vLLM's V2 runner, as vLLM's scheduler hands them: real
``SchedulerOutput`` / ``NewRequestData`` / ``CachedRequestData`` objects (built as vLLM's own
warmup builds its synthetic steps, ``vllm/v1/worker/gpu/warmup.py``).

The serving shape is the ring's worst case for new-request pools: a new request in every step
(every pool a new request stages is used every step), the others decoding one token, a block
appended whenever a request crosses a block boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._harness import BLOCK, VOCAB

__all__ = ["Serving", "empty", "serving"]

PROMPT = 5


def _new(req_id: str, prompt: int, blocks: list[list[int]], temperature: float) -> Any:
    from vllm import SamplingParams
    from vllm.v1.core.sched.output import NewRequestData

    tokens = [(7 * len(req_id) + j) % VOCAB for j in range(prompt)]
    params = SamplingParams(max_tokens=64, temperature=temperature, seed=3)
    if hasattr(params, "thinking_token_budget"):  # a reasoning request's budget, where it exists
        params.thinking_token_budget = 8
    return NewRequestData(
        req_id=req_id,
        prompt_token_ids=tokens,
        mm_features=[],
        sampling_params=params,
        pooling_params=None,
        block_ids=tuple(blocks),
        num_computed_tokens=0,
        lora_request=None,
        prefill_token_ids=tokens,
    )


def empty() -> Any:
    """A step that schedules nothing (``SchedulerOutput.make_empty()``)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    return SchedulerOutput.make_empty()


@dataclass
class Serving:
    """Requests admitted so far: id -> tokens computed, and the next free block."""

    groups: int = 1
    computed: dict[str, int] = field(default_factory=dict)
    next_block: int = 1

    def _blocks(self, count: int) -> list[list[int]]:
        out = []
        for _ in range(self.groups):
            out.append(list(range(self.next_block, self.next_block + count)))
            self.next_block += count
        return out

    def step(self, *, new: int = 1, decode: bool = True, tokens: bool = True) -> Any:
        """The next step: ``new`` new requests, one token for each running request
        (``decode``); ``tokens=False`` schedules no tokens, but keeps the new requests and
        the appended blocks (a step that schedules nothing yet stages writes)."""
        from vllm.v1.core.sched.output import CachedRequestData

        so = empty()
        cached = CachedRequestData.make_empty()
        for req_id, done in self.computed.items() if decode else ():
            cached.req_ids.append(req_id)
            cached.num_computed_tokens.append(done)
            cached.num_output_tokens.append(max(0, done - PROMPT + 1))
            crosses = done % BLOCK == 0
            cached.new_block_ids.append(tuple(self._blocks(1)) if crosses else None)
            so.num_scheduled_tokens[req_id] = 1
        for i in range(new):
            req_id = f"r{len(self.computed) + i}"
            so.scheduled_new_reqs.append(_new(req_id, PROMPT, self._blocks(1), 0.5 + i / 10))
            so.num_scheduled_tokens[req_id] = PROMPT
        so.scheduled_cached_reqs = cached
        for req_id, count in so.num_scheduled_tokens.items():
            self.computed[req_id] = self.computed.get(req_id, 0) + count
        if not tokens:
            so.num_scheduled_tokens = {}
        so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
        return so


def serving(count: int, groups: int = 1) -> list[tuple[str, Any]]:
    """``count`` normal steps: a new request each, the others decoding."""
    plan = Serving(groups)
    return [("normal step", plan.step()) for _ in range(count)]
