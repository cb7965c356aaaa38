"""Requests and the seeded synthetic request trace."""

from __future__ import annotations

import numbers
import random
from dataclasses import dataclass, field

__all__ = ["MAX_TRACE_REQUESTS", "PROMPT_KINDS", "Request", "synthetic_trace"]

MAX_TRACE_REQUESTS = 100_000
"""The most requests :func:`synthetic_trace` builds, and so ``--requests`` of ``warcore run``,
``sanitize``, ``soak`` and the benchmarks accept: about 2 million tokens, hours of serving on
the sim device. More is a typo (``--requests 100000000`` would need gigabytes for the trace
alone), so it is an error rather than a silent multi-minute build."""


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
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"request {self.rid}: max_new_tokens must be an int >= 1, got "
                f"{self.max_new_tokens!r}"
            )

    def problem(
        self, *, vocab_size: int, max_prompt: int, max_kv: int, num_draft: int = 0
    ) -> str | None:
        """Why an engine with this vocabulary and these limits cannot serve this request, or
        ``None``. The engine reports it as this request's error and serves the others."""
        for i, token in enumerate(self.prompt):
            if not isinstance(token, numbers.Integral) or isinstance(token, bool):
                return f"prompt token {token!r} at position {i} is not an integer token id"
            if not 0 <= token < vocab_size:
                return (
                    f"prompt token {token} at position {i} is outside the vocabulary: valid "
                    f"token ids are 0..{vocab_size - 1} (vocab_size {vocab_size})"
                )
        if len(self.prompt) > max_prompt:
            return f"prompt of {len(self.prompt)} tokens is longer than max_prompt {max_prompt}"
        need = self.kv_budget(num_draft)
        if need > max_kv:
            return (
                f"needs {need} KV positions ({len(self.prompt)} prompt + "
                f"{self.max_new_tokens} new tokens - 1 + 2 x {num_draft} drafts); the engine "
                f"has at most {max_kv} per request"
            )
        return None

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


PROMPT_KINDS = ("random", "repetitive", "shared")
"""The prompt shapes :func:`synthetic_trace` makes."""


def synthetic_trace(
    n: int,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    prompt_len: tuple[int, int] = (4, 32),
    output_len: tuple[int, int] = (2, 40),
    mean_gap_steps: float = 1.5,
    prompts: str = "random",
) -> list[Request]:
    """``n`` requests with mixed prompt and output lengths arriving over the first steps
    (``0 <= n <= MAX_TRACE_REQUESTS``).

    ``prompts``: ``"random"`` (uniform tokens), ``"repetitive"`` (each prompt repeats one of
    eight motifs of 2 to 6 tokens: the trace where prompt lookup, ``ngram``, has something to
    find, and prompts with the same motif share a prefix for the host KV tier, ``hicache``), or
    ``"shared"`` (each prompt is one of four fixed 8-to-16-token prefixes, a system prompt,
    then random tokens)."""
    if prompts not in PROMPT_KINDS:
        raise ValueError(f"unknown prompts {prompts!r}; valid: {', '.join(PROMPT_KINDS)}")
    if not isinstance(n, int) or not 0 <= n <= MAX_TRACE_REQUESTS:
        raise ValueError(f"a synthetic trace has 0 to {MAX_TRACE_REQUESTS:,} requests, got {n!r}")
    rng = random.Random(seed)
    heads = random.Random(seed + 1)  # its own stream: the other kinds' traces are unchanged
    shared = [[heads.randrange(vocab_size) for _ in range(heads.randint(8, 16))] for _ in range(4)]
    motifs = [[heads.randrange(vocab_size) for _ in range(heads.randint(2, 6))] for _ in range(8)]
    step = 0
    requests = []
    for rid in range(n):
        step += int(rng.expovariate(1.0 / mean_gap_steps)) if mean_gap_steps > 0 else 0
        plen = rng.randint(*prompt_len)
        if prompts == "repetitive":
            motif = motifs[rng.randrange(len(motifs))]
            prompt = (motif * (plen // len(motif) + 1))[:plen]
        elif prompts == "shared":
            head = shared[rng.randrange(len(shared))]
            prompt = head + [rng.randrange(vocab_size) for _ in range(max(1, plen - len(head)))]
        else:
            prompt = [rng.randrange(vocab_size) for _ in range(plen)]
        requests.append(Request(rid, prompt, rng.randint(*output_len), arrival_step=step))
    return requests
