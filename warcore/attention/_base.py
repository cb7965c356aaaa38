"""The attention-backend metadata contract (DESIGN §2).

A forward's metadata is built in two halves. ``init_forward_metadata_out_graph`` runs eagerly
before a graph replay and may read scheduler-shared buffers and host data;
``init_forward_metadata_in_graph`` is recorded into the graph (static shapes, no host syncs) and
may read shared buffers too. After the in-graph init a contract-following backend reads only its
private metadata, which is why its decode and verify may record ``IN_REPLAY``; following the
contract is declared (``BackendSpec.follows_contract``), never assumed of a subclass.

Writing a backend: what each method must do, and when the reference engine calls it, is in the
method docstrings below. In one forward the runner calls, in stream order on the forward stream:
``load_batch`` (fills the :class:`~warcore.batch.ForwardBatch`: rows, query lengths,
positions, ``out_cache_loc`` read from ``req_to_token``, input ids), then
``init_forward_metadata_out_graph`` (eagerly, before the replay), then
``init_forward_metadata_in_graph`` (captured into the graph, or eagerly), then the model body,
which calls :meth:`AttentionBackend.forward` once per layer. A forward runs either captured
(decode, verify, draft decode and draft-extend, in one graph per batch-size bucket: the batch is
padded with dummy requests, row 0 and ``q_lens`` 0) or eagerly (prefill, and batches no bucket
holds). ``examples/acme_backend`` is a complete backend with its own compute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from warcore.core import HostReads, SharedReadBoundary, parse_host_reads

if TYPE_CHECKING:
    from torch import Tensor

    from warcore.batch import ForwardBatch, KVPool
    from warcore.core import BoundaryContext, ForwardMode

__all__ = ["AttentionBackend"]


class AttentionBackend(ABC):
    """Base class of every attention backend; ``name`` is its stable, plugin-facing identity.

    A subclass **must** set ``name`` (the name its :class:`~warcore.BackendSpec` offers and its
    declarations use) and implement :meth:`init_forward_metadata_out_graph`,
    :meth:`init_forward_metadata_in_graph` and :meth:`forward`. It **may** override
    :meth:`init_forward_metadata` (an eager body of its own: then declare the eager path
    separately, see ``warcore_shared_read_boundary``'s ``eager``),
    :meth:`refine_prefill_boundary` (a per-batch prefill answer) and, for a wrapper over other
    backends, :meth:`children` / :meth:`children_for`.

    Its constructor takes what the engine's factory call passes (:class:`~warcore.BackendSpec`):
    ``pool``, ``max_bs``, ``capacity``, ``context``; it calls ``super().__init__(pool)`` and
    allocates every buffer a captured graph will read, at its largest, since a graph replays
    fixed addresses::

        class MyBackend(AttentionBackend):
            name = "my_backend"

            def __init__(self, pool, max_bs, capacity, context=None):
                super().__init__(pool)
                self.kv_idx = torch.zeros(max_bs, pool.max_context, dtype=torch.int64,
                                          device=pool.req_to_token.device)
    """

    name: ClassVar[str]

    host_reads: ClassVar[Mapping[ForwardMode | str, SharedReadBoundary | str]] = {}
    """Until when this backend's kernels read the forward's staged host buffers
    (``batch.staged``, beyond ``load_batch``'s own copies), per mode: a kernel that reads a
    pinned host buffer when it executes (TensorRT-LLM's ``cp.async`` gather) says so here, and
    the runner keeps the slot until then. A mode not listed reads no host buffer; ``UNKNOWN``
    keeps the slot until the forward is done. Members or their names, as
    :attr:`~warcore.BackendSpec.host_reads` takes them (``{"DECODE": "POST_REPLAY"}``), read
    by :meth:`host_read_items`; a bad one is refused when the class is offered as a spec's
    factory, and when the engine builds the backend."""

    def __init__(self, pool: KVPool) -> None:
        """``pool``: the runner's :class:`~warcore.batch.KVPool` (kept as
        ``self.pool``): the scheduler-shared tables and this model's K/V."""
        self.pool = pool

    def host_read_items(self) -> HostReads:
        """:attr:`host_reads`, validated (:class:`ValueError` naming the backend and its
        class otherwise), as sorted ``(mode, boundary)`` pairs."""
        owner = f"backend {self.name!r}: {type(self).__name__}.host_reads"
        return parse_host_reads(self.host_reads, owner)

    def children(self) -> tuple[AttentionBackend, ...]:
        """Backends this one wraps (all of them, whatever the mode)."""
        return ()

    def children_for(
        self, forward_mode: ForwardMode, context: BoundaryContext
    ) -> tuple[AttentionBackend, ...]:
        """The children whose shared reads run in ``forward_mode``: all of them by default (a
        latest-of wrapper); a selecting wrapper returns the one it runs. The wrapper's boundary
        is the latest of these children's and of its own name's declaration, if any."""
        return self.children()

    def refine_prefill_boundary(self, batch: ForwardBatch) -> SharedReadBoundary:
        """Per-batch prefill answer, asked on the host before each prefill whose decision is to
        publish before the replay (static ``PRE_REPLAY`` declaration, no veto).

        Return ``PRE_REPLAY`` to keep that for this batch (and build here whatever snapshot
        makes it true: the out-graph init that follows must leave no shared read in the
        replay), or anything later to withdraw it for this batch (it publishes nothing). It can
        never make a batch earlier than the static declaration. ``batch.host`` is the step.
        Default: keep the static answer.
        """
        return SharedReadBoundary.PRE_REPLAY

    @abstractmethod
    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        """Eager metadata preparation before the replay; may read shared buffers and host data.

        Must: prepare whatever the in-graph init and the layers need that a graph cannot
        compute (host planning). Runs as device work on the forward stream, after
        ``load_batch`` filled ``batch`` (rows, ``q_lens``, ``positions``, ``out_cache_loc``,
        ``input_ids``); ``batch.host`` is the step on the host (rows, ``q_lens``, ``kv_lens``
        where the host knows them). A graph replay does not repeat it, so it runs before every
        replay and before every eager forward. ``in_capture``: this call precedes a capture's
        warm-up (the batch holds dummy data). Reading ``req_to_token`` here and nowhere later,
        into private buffers, is what a ``PRE_REPLAY`` declaration promises (acme).
        """

    @abstractmethod
    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        """Static-shape device ops recorded into the graph; the last place shared reads may end
        for a contract-following backend.

        Must: only device ops on fixed-address buffers (no ``.item()``, ``.cpu()``,
        ``.tolist()``, no shapes that depend on data), because it is captured once per
        batch-size bucket and replayed. After it, a contract-following backend's layers read
        only private buffers: what its spec declares with ``follows_contract`` (decode and
        verify ``IN_REPLAY``).
        """

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Eager runs: both halves in order. May be overridden by a backend with an eager body
        of its own (then its eager decode/verify/draft-extend need their own declaration)."""
        self.init_forward_metadata_out_graph(batch)
        self.init_forward_metadata_in_graph(batch)

    @abstractmethod
    def forward(self, layer: int, q: Tensor, k: Tensor, v: Tensor, batch: ForwardBatch) -> Tensor:
        """Store this layer's new K/V and return attention output ``[bs, max_q, heads, dim]``.

        ``q``: ``[bs, max_q, heads, dim]`` (RoPE applied); ``k``/``v``:
        ``[bs, max_q, kv_heads, dim]``. Must: write ``k``/``v`` of query token ``[i, j]`` at
        slot ``batch.out_cache_loc[i, j]`` of layer ``layer`` in ``pool.k``/``pool.v`` (for a
        layer in ``pool.swa_layers``, at ``full_to_swa_index_mapping[slot]`` in
        ``pool.swa_k``/``pool.swa_v``: the sliding-window pool), then attend causally: query
        ``[i, j]`` at ``batch.positions[i, j]`` sees the request's keys at positions ``0 ..
        positions[i, j]`` (the last ``pool.cfg.sliding_window`` of them in a window layer), whose
        slots are ``req_to_token[batch.req_pool_indices[i], :]``. Padding tokens (``j >=
        q_lens[i]``, and every token of a dummy request in row 0) sit at position 0 and write
        slot 0, which no request owns; their output is ignored. Runs
        inside the graph: the in-graph init's rules apply. Reading a shared table here (rather
        than a private copy made in an init) is a read during the replay: ``POST_REPLAY``.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
