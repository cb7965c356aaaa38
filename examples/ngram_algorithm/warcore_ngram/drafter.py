"""Prompt lookup: propose what followed the last n-gram of a request's tokens the last time it
appeared earlier in the same request (its prompt or its output so far).

A host-side :class:`warcore.engine.drafter.Drafter`: it keeps, per row, the request's tokens and
an index from each n-gram to where its most recent earlier occurrence ended, and extends both
incrementally from ``batch.committed`` at each step. Nothing here reads the scheduler-shared
buffers. On CUDA, ``batch.committed`` costs a device-to-host synchronisation per step (see the
contract in :mod:`warcore.engine.drafter`); on the ``sim`` device it runs on the forward
stream's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warcore.engine.drafter import DraftInput, DraftLocation

__all__ = ["PromptLookupDrafter", "RowIndex", "lookup"]


@dataclass
class RowIndex:
    """One request's tokens and, per n-gram, the position right after its latest occurrence
    that is not the sequence's own suffix (where its continuation starts)."""

    request_id: int
    tokens: list[int] = field(default_factory=list)
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0
    """n-grams ending before this position are in ``after``."""

    def extend(self, committed: Sequence[int], max_n: int) -> None:
        """Catch up with ``committed`` (the request's tokens so far; the known ones are its
        prefix), indexing every n-gram that now has a continuation."""
        known = len(self.tokens)
        if list(committed[:known]) != self.tokens:  # never for a well-behaved engine
            self.tokens, self.after, self.indexed = [], {}, 0
            known = 0
        self.tokens.extend(committed[known:])
        tokens = self.tokens
        # An n-gram ending at e (inclusive) is followed by tokens[e + 1]: index it once that
        # token exists, so a lookup of the current suffix finds an *earlier* occurrence.
        for end in range(self.indexed, len(tokens) - 1):
            for n in range(1, max_n + 1):
                if end + 1 >= n:
                    self.after[tuple(tokens[end + 1 - n : end + 1])] = end + 1
        self.indexed = max(self.indexed, len(tokens) - 1)


def lookup(index: RowIndex, k: int, max_n: int, min_n: int) -> list[int]:
    """``k`` proposals: the longest suffix n-gram (``max_n`` down to ``min_n``) seen earlier,
    continued periodically from there; the last token repeated when none matches."""
    tokens = index.tokens
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        start = index.after.get(tuple(tokens[-n:]))
        if start is None:
            continue
        period = len(tokens) - start  # the suffix repeats what followed `start - n`
        ext = list(tokens)
        for _ in range(k):
            ext.append(ext[len(ext) - period])
        return ext[len(tokens) :]
    return [tokens[-1]] * k if tokens else [0] * k


class PromptLookupDrafter:
    """The ``ngram`` algorithm's drafter (``location = "host"``)."""

    location: DraftLocation = "host"
    """It reads ``batch.committed``: on CUDA a device-to-host synchronisation per step."""

    def __init__(self, num_draft: int, *, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.num_draft = num_draft
        self.max_n, self.min_n = max_n, min_n
        self.rows: dict[int, RowIndex] = {}

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        index = RowIndex(request_id)
        index.extend(prompt, self.max_n)
        self.rows[row] = index

    def release(self, row: int) -> None:
        self.rows.pop(row, None)

    def propose(self, batch: DraftInput) -> None:
        assert batch.committed is not None  # a host drafter is given the committed tokens
        drafts = []
        for row, rid, committed in zip(
            batch.row_ids, batch.request_ids, batch.committed, strict=True
        ):
            index = self.rows.get(row)
            if index is None or index.request_id != rid:  # not admitted: start from here
                index = self.rows[row] = RowIndex(rid)
            index.extend(committed, self.max_n)
            drafts.append(lookup(index, batch.num_draft, self.max_n, self.min_n))
        batch.write(drafts)
