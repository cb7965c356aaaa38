"""The model runner: one model + one attention backend on the forward stream.

A forward is four phases, whatever executes it: ``load_batch`` (copy the step into static
buffers, derive positions and KV slots, then the backend's out-graph init), the in-graph init,
the model body, and ``emit`` (copy the sampled tokens to the host). Sub-runners (eager, graph)
only decide *how* the middle two run and *where* the read-done event is recorded, and they take
that decision from the precomputed :class:`~warcore.core.DecisionCache` — never a hook call.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from warcore.batch import (
    ForwardBatch,
    HostStaging,
    KVPool,
    Model,
    RowState,
    StagedInputs,
    StepInput,
)
from warcore.core import (
    ForwardMode,
    RecordPoint,
    SharedReadBoundary,
    host_release_point,
    runner_kind_for,
)
from warcore.device import Device, Event, EventRing, ForwardId, Stream

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend
    from warcore.core import BoundaryContext, Decision, DecisionCache, DecisionKey, Execution

__all__ = ["PROMPT_MODES", "ForwardProbe", "ModelRunner", "ReadDoneMailbox", "StepOutput", "Work"]

PROMPT_MODES = frozenset({ForwardMode.EXTEND, ForwardMode.DRAFT_EXTEND})
"""Forwards over a prompt: host tokens, positions from 0, the last token is sampled."""


# -- forward probes ----------------------------------------------------------------------
# Let an audit tool act at a forward's phases in stream order.
#
# The WAR sanitizer poisons the shared buffers at the record point; the read tracer tags each
# launched piece of work with its phase. Both need to run *where the runner records*, on the
# forward stream, not wherever the host happens to be, so the runners call a probe at exactly
# those places. A runner without a probe pays one attribute test per launch.

Work = Callable[[], object]


class ForwardProbe:
    """No-op base class: override what you need.

    Every method is called on the host thread that launches the forward, in launch order, inside
    the forward stream's ``use_stream`` block: device work a method launches lands at that point
    of the forward stream, on ``sim`` and on ``cuda`` alike.
    """

    in_graph = True
    """Whether :meth:`at_record_point` ever acts at an ``IN_GRAPH_NODE``: ``False`` spares the
    capture of the probe graphs (a probe that only watches)."""

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        """A forward is about to start (before ``load_batch``), with the decision it uses.

        Return whether to act at its record point: ``True`` makes the runner call
        :meth:`at_record_point` (and, for ``IN_GRAPH_NODE``, replay the probe graph instead
        of the plain one); ``False`` runs the forward as if no probe were there.
        """
        return False

    def begin_staging(self, runner: ModelRunner, step: StepInput) -> None:
        """``runner`` is about to launch the staged shared reads of ``step``'s forward, which
        begins later (stage, then publish); :meth:`end_staging` follows them. The work
        launched in between (``wrap``) belongs to that later forward."""

    def end_staging(self, runner: ModelRunner) -> None:
        """The staged reads :meth:`begin_staging` announced have been launched."""

    def wrap(self, runner: ModelRunner, label: str, fn: Work) -> Work:
        """The runner is about to launch ``fn`` as work ``label`` of the current forward
        (``load_batch``, ``fill_inputs``, ``out_graph_init``, ``in_graph_init``, ``embed``,
        ``layer<i>``, ``sample``); return the work to launch instead. Graph captures call it
        too, so a wrapper captured into a graph runs on every replay."""
        return fn

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        """Where the runner records the read-done event, right after it recorded it.

        For ``IN_GRAPH_NODE`` this is called while capturing the runner's probe graph (right
        after the planted node), once per bucket, not per replay: launch device work only; the
        graph replays it at the node every time the probe graph runs.
        """

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        """The body has been launched; its outputs are in ``runner.outputs(fb)`` in stream
        order (before ``emit`` copies them to the host)."""


class ReadDoneMailbox:
    """Where a runner leaves the read-done event of its latest forward (sglang's
    ``war_fastpath_read_done_event``); the scheduler's barrier takes and clears it.

    Beside the event it keeps the forward that published it: the forward a wait on the event
    *means*. Which record the wait *binds to* is the event's, at the wait
    (:meth:`Stream.wait_event <warcore.device.Stream.wait_event>` returns it); the binding
    audit compares the two."""

    def __init__(self) -> None:
        self._event: Event | None = None
        self._forward: ForwardId | None = None

    def put(self, event: Event | None, forward: ForwardId | None = None) -> None:
        self._event = event
        self._forward = forward

    def take(self) -> Event | None:
        event, self._event = self._event, None
        return event

    def take_published(self) -> tuple[Event | None, ForwardId | None]:
        """Take and clear the event and the forward that published it."""
        event, forward = self._event, self._forward
        self._event = self._forward = None
        return event, forward

    def peek(self) -> Event | None:
        return self._event

    def peek_published(self) -> tuple[Event | None, ForwardId | None]:
        """The event and its forward, left in place (a second consumer's view)."""
        return self._event, self._forward


@dataclass
class StepOutput:
    """A launched forward: its results arrive in the host tensors once ``done`` completes.

    ``tokens[i, j]`` is the greedy token after query position ``j`` of request ``i``;
    ``sample_index[i]`` is the position whose token continues the request: the last prompt
    token for a prefill, the number of accepted draft tokens for a verify (0 for a decode).
    """

    step: StepInput
    batch: ForwardBatch
    tokens: torch.Tensor
    sample_index: torch.Tensor
    done: Event
    record_point: RecordPoint

    def result(self) -> tuple[list[list[int]], list[int]]:
        """Block the host until this forward finished; its tokens and sample indices."""
        self.done.synchronize()
        return self.tokens.tolist(), self.sample_index.tolist()


class _Activations:
    """Hidden states handed from one launch of the body to the next."""

    h: torch.Tensor


class ModelRunner:
    """Owns the forward-side state its sub-runners share: mailbox, outputs, row state."""

    def __init__(
        self,
        *,
        device: Device,
        forward_stream: Stream,
        model: Model,
        pool: KVPool,
        backend: AttentionBackend,
        context: BoundaryContext,
        decisions: DecisionCache,
        rows: RowState,
        max_bs: int,
        capacity: int,
        name: str = "target",
        draft: bool = False,
        modelled_layer_s: float = 0.0,
        staging: HostStaging | None = None,
        host_reads: Mapping[ForwardMode, SharedReadBoundary] | None = None,
    ) -> None:
        """``staging``: the ring this runner stages its forwards' host inputs in (default: two
        slots, guarded, enough for one step of one forward in flight). ``host_reads``: until
        when the backend's kernels read those host buffers, per mode (default: the backend
        class's ``host_reads``; the engine adds its spec's)."""
        self.device = device
        self.forward_stream = forward_stream
        self.model = model
        self.pool = pool
        self.backend = backend
        self.context = context
        self.decisions = decisions
        self.rows = rows
        self.name = name
        self.draft = draft
        if modelled_layer_s and device.name != "sim":
            raise ValueError("modelled_layer_s models GPU kernel time on the sim device only")
        self.modelled_layer_s = modelled_layer_s
        """A draft model's runner: its decode steps are ``RunnerKind.DRAFT_DECODE``, which
        publish only when the algorithm's publish phase is ``DECODE`` (never for EAGLE)."""
        self.max_bs = max_bs
        self.capacity = capacity
        self._init_publishing(device, name)
        self._init_outputs(device, model, capacity, max_bs)
        self._init_host_staging(device, backend, staging, host_reads)
        self._init_stager()

    def _init_publishing(self, device: Device, name: str) -> None:
        self.mailbox = ReadDoneMailbox()
        self.ring = EventRing(device, 1, f"runner {name!r}")
        """Where :meth:`publish` draws its read-done events from; the engine replaces it with
        one as deep as the records this runner can have in flight (see
        :func:`warcore.device.records_in_flight`)."""
        self.step_index = 0
        """The engine's step this runner's next forwards belong to (their records carry it)."""
        self.forward: ForwardId | None = None
        """The forward in progress (its records carry this id)."""
        self.published: Counter[tuple[ForwardMode, RecordPoint]] = Counter()
        self.on_forward: Callable[[str, ForwardMode, RecordPoint], None] | None = None
        """Called at each emit (the engine's observer); ``None`` costs nothing."""
        self.probe: ForwardProbe | None = None
        """An audit tool's hooks at the forward's phases (sanitizer, read tracer); set it
        through :meth:`RunnerGroup.set_probe`, which also captures the probe graphs."""

    def _init_outputs(self, device: Device, model: Model, capacity: int, max_bs: int) -> None:
        tdev = device.torch_device
        cfg = model.cfg
        self.out_tokens = torch.zeros(capacity, dtype=torch.int64, device=tdev)
        self.hidden_out = torch.zeros(capacity, cfg.hidden, dtype=cfg.dtype, device=tdev)
        self.sample_index = torch.zeros(max_bs, dtype=torch.int64, device=tdev)
        self._query_pos = torch.arange(capacity, device=tdev)
        self._act = _Activations()

    def _init_host_staging(
        self,
        device: Device,
        backend: AttentionBackend,
        staging: HostStaging | None,
        host_reads: Mapping[ForwardMode, SharedReadBoundary] | None,
    ) -> None:
        pin = device.name == "cuda"
        self.staging = staging or HostStaging(self.max_bs, self.capacity, 2, pin=pin)
        self.staged: StagedInputs | None = None
        """The slot of the forward being launched (set by ``load_batch``)."""
        self.host_reads = dict(backend.host_read_items() if host_reads is None else host_reads)
        self._host_release = RecordPoint.NONE
        self._host_releases: dict[tuple[ForwardMode, RecordPoint], RecordPoint] = {}

    def _init_stager(self) -> None:
        self.prefill_shared_read_stager: Callable[[ForwardBatch], bool] | None = None
        """sglang #38554's hook: the algorithm's per-batch stager of the step's later shared
        reads, called by this runner's prefill before it records (the engine sets it on the
        target runner; see :meth:`stage_prefill`)."""
        self.stager_owner = ""
        """Who the stager is (``algorithm 'x' (plugin 'y')``), for its problems."""
        self.stager_raised: dict[str, tuple[int, str]] = {}
        """Kind (``raised``, ``non-bool``) -> (batches, the first message), since the last
        reset: what the stager did wrong; each such batch counted as not staged."""
        self.staged_prefills = 0

    def outputs(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of ``fb``'s sampled tokens, last hidden states and sample indices."""
        bs, mq = fb.batch_size, fb.max_q
        n = bs * mq
        return (
            self.out_tokens[:n].view(bs, mq),
            self.hidden_out[:n].view(bs, mq, -1),
            self.sample_index[:bs],
        )

    def _launch(self, fn: Work, label: str) -> None:
        """Launch one piece of the forward, through the probe when one is installed."""
        probe = self.probe
        if probe is not None:
            fn = probe.wrap(self, label, fn)
        self.device.launch(fn, label)

    # -- the four phases ------------------------------------------------------------------
    def load_batch(self, step: StepInput, fb: ForwardBatch, in_capture: bool = False) -> None:
        """Copy ``step`` into ``fb``, derive positions and slots, then the out-graph init."""
        slot = self.staged = self.staging.stage(step)  # host work: waits for the slot's release
        rows_host, q_lens_host, prompt_host = slot.views()
        state, req_to_token, j = self.rows, self.pool.req_to_token, self._query_pos[: fb.max_q]
        offset = step.offset
        # The host KV tier loaded these positions' KV back: the target's prefill attends over
        # it and writes them to the dummy slot (a draft model's own pool is not cached).
        cached = None
        if step.cached is not None and not self.draft and any(step.cached):
            cached = torch.tensor(step.cached, dtype=torch.int64)

        def copy() -> None:
            fb.req_pool_indices.copy_(rows_host, non_blocking=True)
            fb.q_lens.copy_(q_lens_host, non_blocking=True)
            valid = j.unsqueeze(0) < fb.q_lens.unsqueeze(1)
            if prompt_host is not None:
                fb.input_ids.copy_(prompt_host, non_blocking=True)
                pos = j.unsqueeze(0).expand_as(fb.positions)
            else:
                base = state.kv_len[fb.req_pool_indices] + offset
                pos = base.unsqueeze(1) + j.unsqueeze(0)
            fb.positions.copy_(pos.masked_fill(~valid, 0))
            slots = req_to_token[fb.req_pool_indices.unsqueeze(1), fb.positions]
            if cached is not None:
                kept = cached.to(fb.q_lens.device, non_blocking=True)
                valid = valid & (j.unsqueeze(0) >= kept.unsqueeze(1))
            fb.out_cache_loc.copy_(slots.masked_fill(~valid, 0))

        self._launch(copy, "load_batch")
        if step.fill is not None:
            fill = step.fill
            self._launch(lambda: fill(fb), "fill_inputs")
        backend = self.backend
        # Bind this step's host data now: on the sim device the launch runs later, when the
        # static batch may already describe the next step.
        planned = replace(fb, host=step, staged=slot)
        self._launch(
            lambda: backend.init_forward_metadata_out_graph(planned, in_capture), "out_graph_init"
        )

    def fill_inputs(self, step: StepInput, fb: ForwardBatch) -> None:
        """The step's ``fill`` alone (a staged forward's: its load ran at staging time)."""
        if step.fill is not None:
            fill = step.fill
            self._launch(lambda: fill(fb), "fill_inputs")

    def in_graph_init(self, fb: ForwardBatch) -> None:
        backend = self.backend
        self._launch(lambda: backend.init_forward_metadata_in_graph(fb), "in_graph_init")

    def body(self, fb: ForwardBatch) -> None:
        model, backend, act = self.model, self.backend, self._act
        out, hidden, sample = self.outputs(fb)
        j = self._query_pos[: fb.max_q]
        prompt = fb.forward_mode in PROMPT_MODES

        def embed() -> None:
            act.h = model.embed(fb)

        pause = self.modelled_layer_s

        def layer(i: int) -> None:
            act.h = model.layer(i, act.h, fb, backend)
            if pause:
                time.sleep(pause)

        def sample_tokens() -> None:
            hidden.copy_(act.h)
            out.copy_(model.sample(act.h))
            if prompt:
                # Clamped: a corrupted q_len (a raced staging buffer) gives wrong tokens, not
                # an index past the batch.
                sample.copy_((fb.q_lens - 1).clamp(min=0, max=fb.max_q - 1))
                return
            # Greedy verification: the leading drafts that equal the target's own next token.
            drafts_ok = (fb.input_ids[:, 1:] == out[:, :-1]) & (
                j[1:].unsqueeze(0) < fb.q_lens.unsqueeze(1)
            )
            sample.copy_(drafts_ok.to(torch.int64).cumprod(1).sum(1))

        self._launch(embed, "embed")
        for i in range(model.cfg.layers):
            self._launch(lambda i=i: layer(i), f"layer{i}")  # type: ignore[misc]
        self._launch(sample_tokens, "sample")

    def emit(self, step: StepInput, fb: ForwardBatch, point: RecordPoint) -> StepOutput:
        """Copy the real requests' tokens and sample indices to the host."""
        bs = step.batch_size
        pin = self.device.name == "cuda"
        tokens = torch.empty((bs, fb.max_q), dtype=torch.int64, pin_memory=pin)
        sample_host = torch.empty(bs, dtype=torch.int64, pin_memory=pin)
        out, _, sample = self.outputs(fb)
        if self.probe is not None:
            self.probe.end(self, step, fb, point)

        def copy_out() -> None:
            tokens.copy_(out[:bs], non_blocking=True)
            sample_host.copy_(sample[:bs], non_blocking=True)

        self.device.launch(copy_out, "emit")
        done = self.forward_stream.record_event()
        slot = self.staged
        if slot is not None and slot.release is None:
            slot.release = done  # the host buffers' reads ended no later than the forward
        self.published[(step.forward_mode, point)] += 1
        if self.on_forward is not None:
            self.on_forward(self.name, step.forward_mode, point)
        return StepOutput(step, fb, tokens, sample_host, done, point)

    def commit(self, out: StepOutput) -> None:
        """Advance each row past what this forward accepted (device work, forward stream)."""
        fb, bs, state = out.batch, out.step.batch_size, self.rows
        tokens, hidden, sample = self.outputs(fb)

        def commit_rows() -> None:
            rows = fb.req_pool_indices[:bs]
            s = sample[:bs]
            picked = torch.arange(bs, device=s.device)
            state.kv_len.index_copy_(0, rows, fb.positions[:bs, 0] + s + 1)
            state.token.index_copy_(0, rows, tokens[picked, s])
            state.feature.index_copy_(0, rows, hidden[picked, s])

        with self.device.use_stream(self.forward_stream):
            self.device.launch(commit_rows, "commit")

    # -- stage, then publish -------------------------------------------------------------
    def stage_prefill(self, batch: ForwardBatch) -> bool:
        """Ask the stager whether it staged ``batch``'s later shared reads. Only ``True`` is
        a yes: what raises or answers a non-bool is recorded (:attr:`stager_raised`) and
        counts as ``False`` for this batch, never raised into the engine."""
        stager = self.prefill_shared_read_stager
        if stager is None:
            return False
        try:
            answer = stager(batch)
        except Exception as exc:
            self._stager_problem("raised", f"{type(exc).__name__}: {exc}")
            return False
        if not isinstance(answer, bool):
            self._stager_problem("non-bool", f"answered {answer!r}, not a bool")
            return False
        self.staged_prefills += answer
        return answer

    def _stager_problem(self, kind: str, first: str) -> None:
        n, seen = self.stager_raised.get(kind, (0, first))
        self.stager_raised[kind] = (n + 1, seen)

    def stager_problems(self) -> list[str]:
        """One line per kind of stager failure since the last reset, naming its owner."""
        owner = self.stager_owner or "the algorithm"
        what = {"raised": "raised", "non-bool": "answered a non-bool"}
        return [
            f"{owner}: its prefill_shared_read_stager {what.get(kind, kind)} {n} time(s), "
            f"first {first}; those prefills counted as not staged (no early publish)"
            for kind, (n, first) in sorted(self.stager_raised.items())
        ]

    # -- deciding and publishing ---------------------------------------------------------
    def decision_handle(self, mode: ForwardMode, execution: Execution) -> int:
        """The decision-cache handle of this runner's forwards of ``mode`` executed as
        ``execution``: resolved once, then a replay's decision is one dict hit on an int."""
        kind = runner_kind_for(mode, draft=self.draft)
        key: DecisionKey = (kind, self.backend, mode, self.context, execution)
        return self.decisions.handle(key)

    def start_forward(self, step: StepInput, decision: Decision) -> ForwardProbe | None:
        """Empty the mailbox (this forward has published nothing yet) and ask the audit probe,
        if one is installed, whether it acts in this forward: the probe that does, or ``None``."""
        self.mailbox.put(None)
        self.forward = self.device.begin_forward(self.step_index, self.name, step.forward_mode.name)
        key = (step.forward_mode, decision.record_point)
        release = self._host_releases.get(key)
        if release is None:
            until = self.host_reads.get(step.forward_mode)
            release = self._host_releases[key] = host_release_point(key[1], until)
        self._host_release = release
        probe = self.probe
        return probe if probe is not None and probe.begin(self, step, decision) else None

    def publish(self, point: RecordPoint, mode: ForwardMode, probe: ForwardProbe | None) -> None:
        """The forward has reached its decided record ``point``: record a fresh read-done
        event on the forward stream, here, and let ``probe`` act right after it (in stream
        order: the sanitizer's poison lands exactly there)."""
        self.mailbox.put(self.ring.record(self.forward_stream), self.forward)
        if point is self._host_release and self.staged is not None:
            # the slot needs its own record: a ring event is re-armed by a later forward
            self.staged.release = self.forward_stream.record_event()
        if probe is not None:
            probe.at_record_point(self, mode, point)
