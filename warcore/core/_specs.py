"""Small typed objects that plugins return and hooks receive."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from ._boundary import SharedReadBoundary, latest
from ._modes import CONTRACT_MODES, ForwardMode
from ._steps import StepSpec

__all__ = [
    "CORE_FLAGS",
    "EVENT_OWNERS",
    "FlagSpec",
    "INT_FLAG_BOUNDS",
    "AlgorithmSpec",
    "Backend",
    "BackendSpec",
    "BoundaryContext",
    "StepFacts",
    "FlagValue",
    "NCCL_ALLGATHER_IN_OVERLAP",
    "HostReads",
    "parse_host_reads",
    "validate_name",
]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

NCCL_ALLGATHER_IN_OVERLAP = "nccl_allgather_in_overlap"
"""Context flag: an NCCL all-gather syncs the batch inside the overlap loop (trtllm_mha)."""


class Backend(Protocol):
    """What the core asks of a built attention backend (a
    :class:`warcore.attention.AttentionBackend`): its stable ``name``; a wrapper also answers
    ``children_for(forward_mode, context)``, looked up when it is resolved."""

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class FlagSpec:
    """An engine flag a declaration, a veto or a backend reads from the context.

    ``kind`` is ``bool``, ``int`` or ``str``; ``default`` is what ``context.flag(name)`` means
    when the flag is not set. The core's flags are in :data:`CORE_FLAGS`; a plugin declares its
    own so that ``--flag`` can reject a typo (an ignored flag can keep an earlier record point).
    An ``int`` flag takes values from ``bounds`` (least, most), by default
    :data:`INT_FLAG_BOUNDS`; every value outside is refused, as a typo would be::

        FlagSpec("my_offload_chunks", int, 4, "chunks kept on the host", bounds=(1, 64))
    """

    name: str
    kind: type
    default: FlagValue
    description: str
    bounds: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        validate_name("flag", self.name)
        if self.kind not in (bool, int, str):
            raise TypeError(f"flag {self.name!r}: kind must be bool, int or str")
        if type(self.default) is not self.kind:
            raise TypeError(f"flag {self.name!r}: default {self.default!r} is not {self.kind}")
        object.__setattr__(self, "bounds", self._bounds())

    def _bounds(self) -> tuple[int, int] | None:
        if self.kind is not int:
            if self.bounds is not None:
                raise ValueError(f"flag {self.name!r}: bounds are for an int flag only")
            return None
        given = INT_FLAG_BOUNDS if self.bounds is None else self.bounds
        if (
            not isinstance(given, tuple)
            or len(given) != 2
            or any(type(b) is not int for b in given)
            or given[0] > given[1]
        ):
            raise ValueError(
                f"flag {self.name!r}: bounds must be (least, most) ints, got {given!r}"
            )
        if not given[0] <= cast(int, self.default) <= given[1]:
            raise ValueError(
                f"flag {self.name!r}: default {self.default!r} is outside its bounds, "
                f"{given[0]} to {given[1]}"
            )
        return given


INT_FLAG_BOUNDS = (0, 2**31 - 1)
"""The values an ``int`` flag takes when its :class:`FlagSpec` declares no ``bounds``."""


EVENT_OWNERS = ("target", "draft")
"""The runners that can own a step's read-done event."""

FlagValue = bool | int | str

HYBRID_PREFILL = "hybrid_prefill_backend"
HYBRID_DECODE = "hybrid_decode_backend"
SPEC_ATTN_IS_DECODE = "spec_attn_is_decode"
LAYER_HYBRID = "layer_hybrid_backends"


def validate_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid backend/algorithm name, else raise naming the value."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid {kind} name {name!r}: use lowercase letters, digits and '_', "
            "starting with a letter (at most 64 characters)"
        )
    return name


HostReads = tuple[tuple[ForwardMode, SharedReadBoundary], ...]
"""Validated host reads: sorted ``(mode, boundary)`` pairs."""


def parse_host_reads(given: object, owner: str) -> HostReads:
    """``given`` (mode -> boundary, a mapping or pairs, each a member or its name in any case:
    ``{"DECODE": "POST_REPLAY"}``) as sorted validated pairs: the one reading of every
    ``host_reads`` (:attr:`BackendSpec.host_reads`, a backend class's). Anything else is a
    :class:`ValueError` naming ``owner`` and the value; nothing is dropped."""
    try:
        if isinstance(given, str):
            raise TypeError("a str, not a mapping")
        items = given.items() if isinstance(given, Mapping) else cast(Iterable[Any], given)
        pairs = {ForwardMode.parse(m): SharedReadBoundary.parse(b) for m, b in items}
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{owner} must map forward modes to shared-read boundaries, got {given!r} ({exc})"
        ) from None
    return tuple(sorted(pairs.items(), key=lambda kv: kv[0].name))


@dataclass(frozen=True)
class BackendSpec:
    """An attention backend offered by a plugin.

    ``factory(**kwargs)`` builds the backend; it is only called when an engine uses the backend,
    so a plugin's entry-point module can stay light and import the backend class lazily. The
    reference engine calls it with four keyword arguments, once per model runner (the target's,
    and the draft model's when the algorithm has one):

    * ``pool``: the runner's :class:`~warcore.batch.KVPool`: the scheduler-shared
      tables (``req_to_token``, ``full_to_swa_index_mapping``) and this model's K/V;
    * ``max_bs``: the most requests one forward holds (size per-request static buffers by it);
    * ``capacity``: the most query tokens one forward holds (size per-token buffers by it);
    * ``context``: the :class:`BoundaryContext` (algorithm name and engine flags).

    It must return an :class:`~warcore.attention.AttentionBackend` whose ``name`` is this
    spec's ``name``. A subclass of ``TorchNativeBackend`` inherits a constructor taking all four;
    a direct ``AttentionBackend`` subclass defines its own (``examples/acme_backend``)::

        def __init__(self, pool, max_bs, capacity, context=None):
            super().__init__(pool)
    """

    name: str
    factory: Callable[..., Backend]
    description: str = ""
    children_for: Callable[[Any, BoundaryContext], Sequence[str]] | None = None
    """A wrapper backend: ``children_for(forward_mode, context)`` names the backends whose
    shared reads run in that mode (all children for a latest-of wrapper, the one it selects for
    a selecting wrapper). Resolution by name takes the latest of theirs and the wrapper's own
    declaration; a built instance answers through its ``children_for`` method instead."""
    engine: str = "warcore"
    """The engine the backend runs in: ``"warcore"`` (the reference engine builds it with
    ``factory``) or another engine's name (``"sglang"``: declarations only; ``run`` refuses it,
    ``sanitize`` skips it saying so, the matrix shows it)."""
    models: str | None = None
    """The name of the backend (usually another engine's, e.g. ``"sglang_trtllm_mha"``) whose
    code this one models. Where both are registered, ``warcore check`` prints a note for each
    mode whose declarations differ (both answers and who gave them); a note never fails
    ``check``: two implementations may differ on purpose, and the modelling plugin documents
    why (its own audit)."""
    follows_contract: Collection[ForwardMode | str] = frozenset()
    """The modes (of :data:`~warcore.CONTRACT_MODES`: ``DECODE``, ``TARGET_VERIFY``) in which
    this backend follows the metadata contract: its shared reads end in its in-graph init, the
    layers read only its private metadata. Where no plugin declares such a mode of a captured
    graph, it is ``IN_REPLAY`` with provenance ``contract:<the plugin offering this spec>``,
    audited by ``warcore sanitize`` like any declaration. Being an ``AttentionBackend`` says
    nothing (a forward may read ``req_to_token`` after the in-graph init, as sglang's own
    ``torch_native`` does): without this line those modes are ``UNKNOWN``, the coarse fence,
    and ``warcore check`` notes it. Audit first, then opt in with one line::

        BackendSpec("my_backend", _make, "paged attention", follows_contract=CONTRACT_MODES)
    """
    host_reads: (
        Mapping[ForwardMode | str, SharedReadBoundary | str]
        | tuple[tuple[ForwardMode, SharedReadBoundary], ...]
    ) = ()
    """Per mode, until when this backend's kernels read the forward's staged host buffers
    (beyond the engine's own copies in ``load_batch``): a kernel that reads pinned host memory
    when it executes (TensorRT-LLM's ``cp.async`` gather of host block offsets) keeps the
    host slot until then. Where ``factory`` is the backend class itself, the class's own
    ``host_reads`` (:attr:`warcore.attention.AttentionBackend.host_reads`) is read by the same
    rule when the spec is made and merged in, the latest per mode: a bad one makes the spec
    (so the plugin's hook) fail, naming the backend and the class, and ``warcore check``
    reports it. Stored as sorted ``(mode, boundary)`` pairs; :meth:`host_read_until` answers per
    mode. ``warcore matrix`` shows where each cell's host slot is released::

        BackendSpec("my_backend", _make, host_reads={"DECODE": "POST_REPLAY"})
    """

    def host_read_items(self) -> HostReads:
        """The declared host reads, as validated ``(mode, boundary)`` pairs."""
        return cast(HostReads, self.host_reads)

    def host_read_until(self, mode: ForwardMode) -> SharedReadBoundary | None:
        """The declared host read of ``mode`` (``None``: it reads no host buffer)."""
        return dict(self.host_read_items()).get(mode)

    def __post_init__(self) -> None:
        validate_name("backend", self.name)
        validate_name("engine", self.engine)
        if self.models is not None:
            validate_name("modelled backend", self.models)
        if not callable(self.factory):
            raise TypeError(f"BackendSpec {self.name!r}: factory must be callable")
        if self.children_for is not None and not callable(self.children_for):
            raise TypeError(f"BackendSpec {self.name!r}: children_for must be callable")
        object.__setattr__(self, "follows_contract", self._contract_modes())
        object.__setattr__(self, "host_reads", self._host_reads())

    def _host_reads(self) -> HostReads:
        """The spec's ``host_reads`` and its backend class's, validated and merged."""
        reads = dict(parse_host_reads(self.host_reads, f"BackendSpec {self.name!r}: host_reads"))
        factory = self.factory
        if isinstance(factory, type) and hasattr(factory, "host_reads"):
            owner = f"BackendSpec {self.name!r}: {factory.__name__}.host_reads"
            for mode, until in parse_host_reads(factory.host_reads, owner):
                reads[mode] = latest(reads.get(mode, until), until)
        return tuple(sorted(reads.items(), key=lambda kv: kv[0].name))

    def _contract_modes(self) -> frozenset[ForwardMode]:
        given = self.follows_contract
        if isinstance(given, str | ForwardMode) or not isinstance(given, Collection):
            raise TypeError(
                f"BackendSpec {self.name!r}: follows_contract must be a collection of forward "
                f"modes (e.g. warcore.CONTRACT_MODES), got {given!r}"
            )
        modes = frozenset(ForwardMode.parse(m) for m in given)
        outside = sorted(m.name for m in modes - CONTRACT_MODES)
        if outside:
            raise ValueError(
                f"BackendSpec {self.name!r}: follows_contract names {', '.join(outside)}; the "
                f"metadata contract covers {', '.join(sorted(m.name for m in CONTRACT_MODES))} "
                "only (declare other modes with warcore_shared_read_boundary)"
            )
        if modes and self.children_for is not None:
            raise ValueError(
                f"BackendSpec {self.name!r}: a wrapper (children_for) reads what its children "
                "read; declare the children's contract, not the wrapper's"
            )
        return modes


@dataclass(frozen=True)
class AlgorithmSpec:
    """A speculative-decoding algorithm offered by a plugin.

    ``step`` (a :class:`~warcore.StepSpec`) describes one step of it: which forwards run, in
    what order, on which runner, which one is the step's last reader of the shared buffers
    (its read-done event's owner), whether a drafter proposes after the commit, and how drafts
    are accepted. When no plugin answers ``warcore_is_war_publish_phase`` or
    ``warcore_step_event_owner`` for the algorithm, the core answers from its step.

    ``family`` names the shape for people (and for algorithms without a ``step``: ``none``,
    ``eagle`` and ``dflash`` stand for the built-in steps; any other family without a step is
    not runnable by the reference engine, which ``warcore check`` reports).

    ``drafter(target_model, num_draft, device)`` builds what the reference engine needs
    besides the target (lazily, like a backend factory; ``target_model`` is the engine's
    :class:`~warcore.engine.model.TinyLlama`): for a step with draft-model phases, the draft
    model (a ``TinyLlama``; the target itself is allowed); for a step with ``propose=True``, a
    :class:`warcore.engine.drafter.Drafter` (the drafter contract: what it is given, what it
    writes and when, device or host). ``None`` when the step needs neither.
    """

    name: str
    family: str
    description: str = ""
    drafter: Callable[..., Any] | None = None
    step: StepSpec | None = None
    engine: str = "warcore"
    """The engine the algorithm runs in: ``"warcore"`` (the reference engine runs its step) or
    another engine's name (``"sglang"``: declarations only; not run or sanitized here)."""
    models: str | None = None
    """The algorithm (usually another engine's, e.g. ``"sglang_eagle"``) this one models: a
    backend that ``models`` another is compared with it under this pair of algorithms too (see
    :attr:`BackendSpec.models`)."""
    prefill_shared_read_stager: Callable[[Any], Callable[[Any], bool]] | None = None
    """Stage, then publish (sglang #38554's ``ModelRunner.prefill_shared_read_stager``): for an
    algorithm whose prefill reads the shared buffers later on another runner (its step's
    prefill ends with the draft's ``DRAFT_EXTEND``, as EAGLE's), a factory the engine calls
    once with its speculative worker (the reference engine's
    :class:`warcore.engine.spec.StepWorker`); it returns the per-batch stager
    ``stager(forward_batch) -> bool``. The target's prefill runner calls the stager with the
    batch (a :class:`warcore.batch.ForwardBatch`, ``batch.host`` the step) before it decides
    where to record: the stager performs, as device work on the forward stream, the shared
    reads the later forwards of the step would make (into their private buffers) and answers
    ``True`` only if it did. Then, and only for a ``PRE_REPLAY`` backend with the prefill
    fast path on and no veto, the prefill publishes before its replay and the target owns
    that step's event (sglang #38169). ``None`` (the default): it never stages, so its prefill
    keeps the coarse fence. A stager that raises or answers anything but a bool counts as
    ``False`` for that batch and is recorded in the run's report, naming the algorithm. The
    built-in ``eagle`` offers :func:`warcore.engine.spec.stage_draft_extend`; a stager that
    answers ``True`` without staging is what ``warcore sanitize`` catches (``later-forward``)::

        AlgorithmSpec("my_eagle", "eagle", drafter=_draft_model, step=EAGLE_STEP,
                      prefill_shared_read_stager=warcore.engine.spec.stage_draft_extend)
    """

    def __post_init__(self) -> None:
        validate_name("algorithm", self.name)
        validate_name("algorithm family", self.family)
        validate_name("engine", self.engine)
        if self.models is not None:
            validate_name("modelled algorithm", self.models)
        if self.drafter is not None and not callable(self.drafter):
            raise TypeError(f"AlgorithmSpec {self.name!r}: drafter must be callable")
        stager = self.prefill_shared_read_stager
        if stager is not None and not callable(stager):
            raise TypeError(
                f"AlgorithmSpec {self.name!r}: prefill_shared_read_stager must be callable "
                f"(a factory taking the engine's worker), got {stager!r}"
            )
        if self.step is not None:
            if not isinstance(self.step, StepSpec):
                raise TypeError(
                    f"AlgorithmSpec {self.name!r}: step must be a warcore.StepSpec, got "
                    f"{type(self.step).__name__} {self.step!r}"
                )
            problem = self.step.problem()
            if problem is not None:
                raise ValueError(f"AlgorithmSpec {self.name!r}: step {problem}")


class BoundaryContext:
    """What a boundary declaration may depend on besides the backend and the mode.

    ``flags`` holds the engine's configuration switches (for example
    :data:`NCCL_ALLGATHER_IN_OVERLAP`), stored sorted. Contexts are interned: equal contexts
    are one object, so they compare and hash by identity, in C. They key the per-replay
    decision lookup, where a Python-level ``__hash__`` alone cost more than a method call.
    """

    __slots__ = ("algorithm", "flags", "__weakref__")
    _interned: ClassVar[dict[tuple[str, tuple[tuple[str, type, FlagValue], ...]], BoundaryContext]]
    _interned = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    algorithm: str
    flags: tuple[tuple[str, FlagValue], ...]

    def __new__(
        cls,
        algorithm: str = "none",
        flags: Mapping[str, FlagValue] | tuple[tuple[str, FlagValue], ...] = (),
    ) -> BoundaryContext:
        items = sorted(dict(flags).items())
        for key, value in items:
            if not isinstance(key, str) or not isinstance(value, bool | int | str):
                raise TypeError(f"BoundaryContext flag {key!r}={value!r}: need str -> bool/int/str")
        name = validate_name("algorithm", algorithm)
        # The value's type is part of the identity: True and 1 are equal, but not the same flag.
        ident = (name, tuple((k, type(v), v) for k, v in items))
        with cls._lock:
            ctx = cls._interned.get(ident)
            if ctx is None:
                ctx = object.__new__(cls)
                object.__setattr__(ctx, "algorithm", name)
                object.__setattr__(ctx, "flags", tuple(items))
                cls._interned[ident] = ctx
        return ctx

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"BoundaryContext is immutable (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"BoundaryContext(algorithm={self.algorithm!r}, flags={self.flags!r})"

    def __reduce__(
        self,
    ) -> tuple[type[BoundaryContext], tuple[str, tuple[tuple[str, FlagValue], ...]]]:
        return (BoundaryContext, (self.algorithm, self.flags))

    def flag(self, name: str, default: Any = False) -> Any:
        for key, value in self.flags:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class StepFacts:
    """Per-rank and per-step facts an algorithm's event owner may depend on.

    ``has_draft_model``: this rank holds a draft model (sglang: not on a non-last pipeline
    rank). ``draft_extend_staged``: this step's draft-extend is staged for the next step
    (multi-layer EAGLE), so it reads nothing in this one.
    """

    has_draft_model: bool = True
    draft_extend_staged: bool = False

    def __post_init__(self) -> None:
        for field in ("has_draft_model", "draft_extend_staged"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"StepFacts.{field} must be a bool, got {getattr(self, field)!r}")


CORE_FLAGS: dict[str, FlagSpec] = {
    f.name: f
    for f in (
        FlagSpec(
            "nccl_allgather_in_overlap",
            bool,
            False,
            "an NCCL all-gather syncs the batch inside the overlap loop (read by trtllm_mha's "
            "draft-extend declaration)",
        ),
        # Host/storage KV offload (sglang's hierarchical cache, its storage backend, LMCache):
        # each one vetoes the prefill fast path (the built-in plugin's veto).
        FlagSpec(
            "hicache",
            bool,
            False,
            "hierarchical KV cache on: vetoes the prefill fast path; the reference engine runs "
            "its host KV tier (a prefix cache in host memory)",
        ),
        FlagSpec(
            "hicache_storage", bool, False, "hierarchical cache storage backend on: vetoes prefill"
        ),
        FlagSpec("lmcache", bool, False, "LMCache on: vetoes the prefill fast path"),
        FlagSpec(
            HYBRID_PREFILL, str, "torch_native", "the hybrid backend's prefill (extend) child"
        ),
        FlagSpec(HYBRID_DECODE, str, "torch_native", "the hybrid backend's decode child"),
        FlagSpec(
            SPEC_ATTN_IS_DECODE,
            bool,
            True,
            "the hybrid backend runs target-verify on its decode child (else on prefill)",
        ),
        FlagSpec(
            LAYER_HYBRID,
            str,
            "torch_native,torch_native",
            "the layer_hybrid backend's children, comma-separated: layer i uses child i mod n",
        ),
    )
}
"""The flags the core and its built-in backends and vetoes read."""
