"""The drafter contract: what a proposing drafter is given, what it writes, when, and where.

An algorithm whose :class:`~warcore.StepSpec` has ``propose=True`` (dflash, dspark, n-gram)
gets its next drafts from a *drafter*: the object its ``AlgorithmSpec.drafter`` factory returns,
``drafter(target_model, num_draft, device)``. It implements :class:`Drafter`::

    class MyDrafter:
        location = "host"          # or "device": see "Device or host" below

        def admit(self, row, request_id, prompt): ...   # a request enters ``row``
        def release(self, row): ...                     # the request in ``row`` is gone
        def propose(self, batch): ...                   # write batch.num_draft drafts per row

**When it is called.** Every call is work on the engine's *forward stream*, in stream order
with the forwards: on the ``sim`` device it runs on the stream's worker thread, on CUDA on the
host when the engine launches the step (its torch ops are queued on the forward stream). So
calls never overlap one another, and each sees the rows exactly as the forwards before it left
them:

* ``admit(row, request_id, prompt)``: before the prefill step that admits ``request_id`` into
  ``row`` (``prompt``: its prompt tokens, a host list). A row is always released before it is
  admitted again.
* ``release(row)``: at the first step launched after the scheduler released the row's request
  (it finished, or the launched forwards are certain to finish it), and for every row still
  admitted when a run ends. Drop what you keep for it.
* ``propose(batch)``: after every step's commit, prefill (``batch.mode`` is ``EXTEND``) and
  decode (``TARGET_VERIFY``) alike, with the :class:`DraftInput` of that step's rows.

**What it writes.** Exactly ``state.drafts[rows, :num_draft]`` for every row of the batch, the
next verify's drafts, and nothing else; :meth:`DraftInput.write` does it from a ``[bs, k]``
tensor or from host lists. Any value is *safe* (verification is greedy and lossless), a good
one is *accepted*: the engine checks the drafts at this boundary, after every ``propose``, as
device work (no host synchronisation), and verifies token ``0`` in place of any draft outside
``0..vocab_size - 1`` (``write`` maps ``NaN``, infinities and other non-integers the same way),
so a wrong draft costs acceptance, never a request. A drafter method that raises is isolated
the same way: the step goes on with the drafts as they are. Either is a broken contract, and
the run's report (``RunReport.drafter_problems``, ``warcore run``'s ``drafter`` line) names the
algorithm, its plugin and how often; it is logged once as a warning. A factory that raises or
returns ``None`` is a :class:`DrafterError` naming both, when the engine is built.

It must not read the scheduler-shared buffers (``req_to_token``,
``full_to_swa_index_mapping``): the step's read-done event was recorded before the drafter
runs, so the scheduler may already be rewriting them (``warcore sanitize`` reports such a read
as ``later-work``).

**What it may read.** ``batch.rows`` and ``batch.row_ids`` (the rows, on the device and the
host), ``batch.request_ids``, ``batch.state`` (:class:`~warcore.batch.RowState`: ``kv_len``,
the next input ``token`` and the target hidden state ``feature`` that predicted it), and each
row's committed tokens: on the device ``batch.history[row, : kv_len[row] + 1]`` (prompt,
accepted output, and last the next input token); on the host ``batch.committed`` (the same, as
lists; host drafters only).

**Device or host.** ``location = "device"``: ``propose`` only queues torch ops on the forward
stream (dflash's block drafter); the host never waits, and the overlap loop schedules step N+1
while step N and its drafting run. ``location = "host"``: the drafter computes in Python from
``batch.committed`` (an n-gram lookup). Those lists are the tokens step N just accepted, which
only exist on the device once N's verify has run: on CUDA, building them is a device-to-host
copy that *synchronises the host with the forward stream* at every step, so the host cannot
schedule N+1 while N runs and the overlap the fine fence buys is gone (the fence stays
correct; only the time is lost). On ``sim`` the call runs on the stream's thread, so the host
does not wait. A drafter that needs host data on CUDA and wants the overlap must keep its
state on the device, or draft one step later from tokens the host has already collected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from warcore.batch import RowState
from warcore.core import ForwardMode
from warcore.runners import StepOutput

__all__ = [
    "AlgorithmFactoryError",
    "DraftInput",
    "DraftLocation",
    "Drafter",
    "DrafterError",
    "LegacyBlockDrafter",
    "INVALID_DRAFT",
    "TokenHistory",
    "as_drafter",
    "check_drafts",
]

DraftLocation = Literal["device", "host"]


class AlgorithmFactoryError(RuntimeError):
    """A factory an algorithm's plugin gives the engine (its drafter, its
    ``prefill_shared_read_stager``) raised, or returned what the engine cannot use; the
    message names the algorithm and its plugin. ``warcore run`` prints it as one line and exits
    1: the plugin failed, not the command line."""


class DrafterError(AlgorithmFactoryError):
    """An algorithm's drafter factory raised, or returned something that is not what its step
    needs (a :class:`Drafter`, or a draft model); the message names the algorithm and its
    plugin."""


@dataclass(frozen=True)
class DraftInput:
    """What :meth:`Drafter.propose` is given for one step's rows (see the module docstring)."""

    mode: ForwardMode
    """The step just committed: ``EXTEND`` (a prefill) or ``TARGET_VERIFY``."""
    num_draft: int
    """``k``: write ``state.drafts[rows, :k]``."""
    rows: torch.Tensor
    """``[bs]`` int64, on the device: the batch's rows (real requests only, no padding)."""
    row_ids: tuple[int, ...]
    """The same rows, on the host."""
    request_ids: tuple[int, ...]
    """The request in each row (``-1`` where the engine did not say)."""
    state: RowState
    """The per-row state after the commit: read ``kv_len``, ``token``, ``feature``; write
    ``drafts``."""
    history: torch.Tensor
    """``[rows, max_context + 1]`` int64 on the device: ``history[r, : kv_len[r] + 1]`` are row
    ``r``'s committed tokens (prompt, accepted output, then the next input token)."""
    committed: tuple[list[int], ...] | None = None
    """Host drafters only: each row's committed tokens as a list (a device-to-host copy; on
    CUDA a synchronisation of the host with the forward stream)."""
    vocab_size: int = 0
    """The target's vocabulary: valid drafts are ``0..vocab_size - 1`` (0: not said)."""

    @property
    def batch_size(self) -> int:
        return len(self.row_ids)

    def write(self, drafts: torch.Tensor | Sequence[Sequence[float]]) -> None:
        """Store ``drafts`` (``[bs, k]``: a tensor, or one list of ``k`` tokens per row) as
        the rows' next drafts. A value that is not a token id (``NaN``, an infinity, a
        fraction, out of the vocabulary) becomes an invalid draft, which the engine replaces
        (see the module docstring); a wrong shape raises."""
        k, state = self.num_draft, self.state
        if not isinstance(drafts, torch.Tensor):
            # float64 holds every token id exactly, and NaN or 1e30 without an overflow.
            drafts = torch.tensor([list(d) for d in drafts], dtype=torch.float64)
        if tuple(drafts.shape) != (self.batch_size, k):
            raise ValueError(
                f"drafts of shape {tuple(drafts.shape)}; expected ({self.batch_size}, {k})"
            )
        if drafts.is_floating_point():
            drafts = _token_ids(drafts, self.vocab_size)
        state.drafts[self.rows, :k] = drafts.to(state.drafts.device, torch.int64)


INVALID_DRAFT = -1
"""What :meth:`DraftInput.write` stores for a value that is not a token id."""


def _token_ids(values: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Floating ``values`` as int64 token ids; each one that is not a whole number in the
    vocabulary (``NaN``, infinities, fractions, out of range) is :data:`INVALID_DRAFT`. Decided
    before the cast, which is undefined for values out of int64's range."""
    limit = vocab_size if vocab_size > 0 else 2**62
    ok = torch.isfinite(values) & (values >= 0) & (values < limit) & (values == values.floor())
    return torch.where(ok, values, torch.full_like(values, INVALID_DRAFT)).to(torch.int64)


def check_drafts(drafts: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Device work at the contract boundary, after ``propose``: every draft outside
    ``0..vocab_size - 1`` becomes token ``0`` (safe: verification is lossless), in place.
    Returns how many there were, as a 0-d device tensor (no host synchronisation)."""
    bad = (drafts < 0) | (drafts >= vocab_size)
    drafts.masked_fill_(bad, 0)
    return bad.sum()


@runtime_checkable
class Drafter(Protocol):
    """A proposing drafter (``StepSpec(propose=True)``); the module docstring is the contract."""

    location: DraftLocation
    """``"device"``: ``propose`` queues device work only; ``"host"``: it reads
    ``batch.committed`` (a device-to-host synchronisation per step on CUDA)."""

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        """A request enters ``row``; its prompt tokens."""
        ...

    def release(self, row: int) -> None:
        """The request in ``row`` is gone."""
        ...

    def propose(self, batch: DraftInput) -> None:
        """Write ``batch.state.drafts[batch.rows, :batch.num_draft]``."""
        ...


class LegacyBlockDrafter:
    """Adapts a drafter written before the contract, an object with ``propose(rows, state)``
    that writes ``state.drafts[rows, :k]`` on the device."""

    location: DraftLocation = "device"

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        pass

    def release(self, row: int) -> None:
        pass

    def propose(self, batch: DraftInput) -> None:
        self.inner.propose(batch.rows, batch.state)


def as_drafter(obj: object, owner: str) -> Drafter:
    """``obj`` as a :class:`Drafter` (adapting a legacy ``propose(rows, state)`` drafter);
    :class:`DrafterError` naming ``owner`` (``algorithm 'x' (plugin 'y')``) otherwise."""
    if isinstance(obj, Drafter):
        if obj.location not in ("device", "host"):
            raise DrafterError(
                f"{owner}: drafter {obj!r} has location {obj.location!r}; "
                "expected 'device' or 'host'"
            )
        return obj
    if callable(getattr(obj, "propose", None)):
        return LegacyBlockDrafter(obj)
    raise DrafterError(
        f"{owner}: its drafter factory returned {obj!r}, which is not a "
        "warcore.engine.drafter.Drafter (location, admit, release, propose)"
    )


class TokenHistory:
    """Each row's committed tokens, kept on the device by the forward stream after each commit.

    ``tokens[r, p]`` is the token at position ``p`` of row ``r``'s request for ``p < kv_len``,
    and ``tokens[r, kv_len]`` its next input token. The last column is a sink for padding.
    """

    def __init__(self, rows: int, max_context: int, device: torch.device) -> None:
        self.tokens = torch.zeros(rows, max_context + 1, dtype=torch.int64, device=device)
        self.sink = max_context

    def record(self, out: StepOutput, state: RowState) -> None:
        """Device work after ``out``'s commit: its input tokens at their positions (the accepted
        ones are the committed ones; later ones are overwritten or past ``kv_len``), then each
        row's next token at its new ``kv_len``. Static shapes: no host synchronisation."""
        fb, bs, tokens = out.batch, out.step.batch_size, self.tokens
        rows = fb.req_pool_indices[:bs]
        positions, ids = fb.positions[:bs], fb.input_ids[:bs]
        j = torch.arange(fb.max_q, device=tokens.device)
        valid = j.unsqueeze(0) < fb.q_lens[:bs].unsqueeze(1)
        cols = torch.where(valid, positions, torch.full_like(positions, self.sink))
        tokens[rows.unsqueeze(1).expand_as(cols), cols] = ids
        tokens[rows, state.kv_len[rows]] = state.token[rows]

    def committed(self, rows: torch.Tensor, state: RowState) -> tuple[list[int], ...]:
        """The rows' committed tokens as host lists (a device-to-host copy)."""
        lens = (state.kv_len[rows] + 1).tolist()
        table = self.tokens[rows].tolist()
        return tuple(t[:n] for t, n in zip(table, lens, strict=True))
