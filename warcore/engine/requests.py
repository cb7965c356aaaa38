"""Requests and the seeded synthetic request trace."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Request", "synthetic_trace"]


@dataclass
class Request:
    """One generation request. Finishing is by length, so the scheduler knows when a request's
    last token is launched and can free its row and slots for the very next step — the reuse
    that makes the write-after-read race real."""

    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int = 0
    output: list[int] = field(default_factory=list)
    error: str | None = None
    row: int = 0
    slots: list[int] = field(default_factory=list)
    swa_slots: list[int] = field(default_factory=list)
    in_flight: int = 0
    """Forwards launched for it whose tokens the host has not collected yet."""
    kv_bound: int = 0
    """Upper bound of its committed KV length once every launched forward has run."""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"request {self.rid}: empty prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.rid}: max_new_tokens must be >= 1")

    def kv_budget(self, num_draft: int = 0) -> int:
        """KV positions reserved for its lifetime. The last sampled token is never fed back;
        with speculation a verify writes ``num_draft`` positions past what it may accept, and
        the overlap loop may launch one more verify before it learns the previous one finished
        the request (accepting up to ``num_draft`` tokens past ``max_new_tokens``), so a
        request reserves ``2 * num_draft`` positions more."""
        return len(self.prompt) + self.max_new_tokens - 1 + 2 * num_draft

    @property
    def guaranteed(self) -> bool:
        """Every forward yields at least one token, so the launched ones will finish it."""
        return len(self.output) + self.in_flight >= self.max_new_tokens

    @property
    def done(self) -> bool:
        return self.error is not None or len(self.output) >= self.max_new_tokens

    def fresh(self) -> Request:
        """An unserved copy (for running the same trace again)."""
        return Request(self.rid, list(self.prompt), self.max_new_tokens, self.arrival_step)


def synthetic_trace(
    n: int,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    prompt_len: tuple[int, int] = (4, 32),
    output_len: tuple[int, int] = (2, 40),
    mean_gap_steps: float = 1.5,
) -> list[Request]:
    """``n`` requests with mixed prompt and output lengths arriving over the first steps."""
    rng = random.Random(seed)
    step = 0
    requests = []
    for rid in range(n):
        step += int(rng.expovariate(1.0 / mean_gap_steps)) if mean_gap_steps > 0 else 0
        plen = rng.randint(*prompt_len)
        prompt = [rng.randrange(vocab_size) for _ in range(plen)]
        requests.append(Request(rid, prompt, rng.randint(*output_len), arrival_step=step))
    return requests
