"""sglang's real classes, asked on bare objects: the oracle behind the plugin and the activation.

Everything warcore-sglang knows about what sglang declares comes from calling sglang's own
methods, never from a copy of their answers: a backend's ``shared_read_ends(mode)`` on an
object made with ``object.__new__(cls)`` carrying the few attributes the method reads (its
children for a wrapper, ``model_runner.spec_algorithm`` for ``dsv4``); an algorithm's
``supports_prefill_shared_read_done()``; a worker class's ``last_shared_read_runner`` property on
a bare worker holding two stand-in runners. Once the activation has patched those methods,
these calls go to the originals (the patched functions pass through while :func:`in_tree`
is active, and :func:`original` unwraps a patched attribute).

sglang is imported on first use (an sglang import takes seconds); every function here may
raise ``ImportError`` where sglang or a GPU-only module it imports is missing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata as md
import importlib.util
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from warcore import BoundaryContext, ForwardMode, SharedReadBoundary, StepFacts
from warcore.core import validate_name
from warcore.integration.patching import unwrap

from ..releases import RELEASES, SglangRelease
from .names import (
    LEAVES,
    MAX_DEPTH,
    PREFIX,
    SRT,
    WRAPPERS,
    algorithm_to_warcore,
    child_name,
    flag_value,
    warcore_name,
)

__all__ = [
    "DISTRIBUTION",
    "api",
    "available",
    "boundary_of",
    "class_for",
    "declare",
    "ends_of",
    "event_owner",
    "in_tree",
    "in_tree_active",
    "installed_version",
    "original",
    "own",
    "publish_phase",
    "registry_names",
    "release",
    "scope",
    "sglang_algorithm",
    "unsupported_reason",
    "warcore_algorithm",
]

DISTRIBUTION = "sglang"


_VERSIONS: dict[tuple[str, ...], str | None] = {}


def installed_version() -> str | None:
    """The installed sglang's version, read once per ``sys.path``: importlib.metadata parses
    the METADATA file on every call (1-3 ms), and the declarations ask for the release in force
    on every answer (11,000 times in one ``warcore matrix``: half its time)."""
    path = tuple(sys.path)
    try:
        return _VERSIONS[path]
    except KeyError:
        pass
    try:
        version: str | None = md.version(DISTRIBUTION)
    except md.PackageNotFoundError:
        version = None
    _VERSIONS[path] = version
    return version


def release() -> SglangRelease | None:
    """The installed sglang's entry in :data:`~warcore_sglang.releases.RELEASES` (its version
    compared exactly: ``0.5.23.post1`` or ``0.5.23+g1234`` is other code), ``None`` if none."""
    version = installed_version()
    return RELEASES.get(version) if version is not None else None


def _facts() -> SglangRelease:
    """The release whose facts name sglang's classes here: the installed one, else (an
    unaudited sglang, whose declarations are stale anyway) the newest audited."""
    found = release()
    return found if found is not None else list(RELEASES.values())[-1]


def scope() -> str:
    """The implementation range every answer of the plugin is declared for: exactly the
    installed release when it is audited (the answers are asked of its classes), else the
    newest audited (so that the core marks them stale: not applied, ``warcore check`` says so).
    ``===`` compares the version string exactly (``==`` would admit local builds)."""
    return f"{DISTRIBUTION}==={_facts().version}"


def unsupported_reason() -> str | None:
    """``None`` when the installed sglang is an audited release, else why not."""
    version = installed_version()
    if version is None:
        return "sglang is not installed"
    if version not in RELEASES:
        return (
            f"sglang {version} is installed; warcore-sglang audited {', '.join(RELEASES)} (exactly)"
        )
    return None


def available() -> bool:
    """sglang is installed (found without importing it)."""
    return importlib.util.find_spec("sglang") is not None


# -- the modules and a few classes, imported once ------------------------------------------


def _import(module: str) -> Any:
    """Import an sglang module, its import-time prints sent to stderr (some sglang modules
    print, and ``warcore matrix --json`` owns stdout)."""
    with contextlib.redirect_stdout(sys.stderr):
        return importlib.import_module(module)


@functools.lru_cache(maxsize=1)
def api() -> SimpleNamespace:
    """sglang's vocabulary: ``AttentionBackend``, ``SharedReadEnds``, ``ForwardMode``,
    ``SpeculativeAlgorithm``, ``CustomSpecAlgo`` and the ``spec_registry`` module."""
    base = _import(SRT + "layers.attention.base_attn_backend")
    batch = _import(SRT + "model_executor.forward_batch_info")
    spec_info = _import(SRT + "speculative.spec_info")
    registry = _import(SRT + "speculative.spec_registry")
    return SimpleNamespace(
        AttentionBackend=base.AttentionBackend,
        SharedReadEnds=base.SharedReadEnds,
        ForwardMode=batch.ForwardMode,
        SpeculativeAlgorithm=spec_info.SpeculativeAlgorithm,
        CustomSpecAlgo=registry.CustomSpecAlgo,
        spec_registry=registry,
    )


def registry_names() -> list[str]:
    """The names in sglang's attention registry (``ATTENTION_BACKENDS``), in its order; the
    names sglang plugins registered in this process included."""
    module = _import(SRT + "layers.attention.attention_registry")
    return list(module.ATTENTION_BACKENDS)


def custom_algorithms() -> list[Any]:
    """The algorithms registered through ``SpeculativeAlgorithm.register`` in this process
    (sglang keeps them in ``spec_registry._REGISTRY``; it has no public list)."""
    return list(getattr(api().spec_registry, "_REGISTRY", {}).values())


_CLASSES: dict[str, tuple[type | None, str]] = {}
_CLASSES_LOCK = threading.Lock()


def _load(ref: str) -> tuple[type | None, str]:
    with _CLASSES_LOCK:
        found = _CLASSES.get(ref)
    if found is not None:
        return found
    module, _, name = ref.partition(":")
    try:
        cls = getattr(_import(SRT + module), name)
        found = (cls, "")
    except Exception as exc:  # a GPU-only import: say which
        found = (None, f"{SRT}{module} cannot be imported here ({type(exc).__name__}: {exc})")
    with _CLASSES_LOCK:
        _CLASSES[ref] = found
    return found


def class_ref(name: str) -> str | None:
    """``module:Class`` (relative to ``sglang.srt``) of a warcore ``sglang_*`` backend name."""
    if name in WRAPPERS:
        return WRAPPERS[name].cls
    facts = _facts()
    if name in LEAVES:
        return None if name in facts.leaves_missing else LEAVES[name]
    if name.startswith(PREFIX):
        return facts.registry.get(name[len(PREFIX) :])
    return None


@functools.lru_cache(maxsize=1)
def class_names() -> dict[str, str]:
    """``module:Qualname`` of each class warcore-sglang names -> its warcore name (the first
    registry name wins: ``fa3`` and ``fa4`` build one class)."""
    facts = _facts()
    table: dict[str, str] = {}
    for name, ref in facts.registry.items():
        table.setdefault(SRT + ref, warcore_name(name))
    for name, ref in LEAVES.items():
        if name not in facts.leaves_missing:
            table[SRT + ref] = name
    for name, shape in WRAPPERS.items():
        table[SRT + shape.cls] = name
    return table


_LEARNED: dict[str, type] = {}


def learn(name: str, cls: type) -> None:
    """Remember the class sglang's registry built for ``name`` in this process, for a name
    the table does not know (a backend an sglang plugin registered): its declarations can
    then be asked of that class."""
    with _CLASSES_LOCK:
        _LEARNED.setdefault(name, cls)


def class_for(name: str) -> tuple[type | None, str]:
    """The class behind a warcore ``sglang_*`` name, or ``None`` and why not."""
    ref = class_ref(name)
    if ref is None:
        learned = _LEARNED.get(name)
        if learned is not None:
            return learned, ""
        return None, f"warcore-sglang does not know which class sglang builds for {name!r}"
    return _load(ref)


# -- passing through the activation's patches ----------------------------------------------


class Depth:
    """How deep this thread is in sglang's own code, asked through :func:`own` or
    :func:`in_tree` (``depth > 0``: patched points answer with sglang's own code). A plain
    object with one slot, reached once per call through the thread-local :data:`TREE`: each
    read or write of a ``threading.local`` attribute finds this thread's dict first (about
    three times a slot's cost), and the prefill point sets and clears it on every batch."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0


_local = threading.local()
TREE: Any = _local
"""``TREE.here``, when this thread has one: its :class:`Depth` (hot paths read it inline;
elsewhere :func:`depth`, :func:`in_tree`, :func:`own`)."""


def depth() -> Depth:
    """This thread's :class:`Depth`, made on its first use."""
    try:
        return _local.here  # type: ignore[no-any-return]
    except AttributeError:
        _local.here = here = Depth()
        return here


@contextlib.contextmanager
def in_tree() -> Iterator[None]:
    """While active (in this thread), patched declaration points answer with sglang's own code."""
    here = depth()
    here.depth += 1
    try:
        yield
    finally:
        here.depth -= 1


def in_tree_active() -> bool:
    here = getattr(_local, "here", None)
    return here is not None and here.depth > 0


def own(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` as sglang's own code (:func:`in_tree` without a context
    manager's cost: the patched points call it on their hot paths)."""
    here = depth()
    here.depth += 1
    try:
        return function(*args, **kwargs)
    finally:
        here.depth -= 1


def original(cls: type, attr: str) -> Any:
    """``cls``'s own (unpatched) ``attr`` as its MRO resolves it: a function or a property."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            return unwrap(vars(klass)[attr])
    raise AttributeError(f"{cls.__qualname__} has no attribute {attr!r}")


# -- conversions ---------------------------------------------------------------------------


def boundary_of(ends: Any) -> SharedReadBoundary:
    """sglang's ``SharedReadEnds`` member -> warcore's boundary (the same four names)."""
    name = getattr(ends, "name", None)
    if not isinstance(ends, api().SharedReadEnds) or not isinstance(name, str):
        raise TypeError(f"expected an sglang SharedReadEnds, got {ends!r}")
    return SharedReadBoundary[name]


def ends_of(boundary: SharedReadBoundary) -> Any:
    return api().SharedReadEnds[boundary.name]


def sglang_mode(mode: ForwardMode) -> Any | None:
    """warcore's mode -> sglang's (``None`` for ``DRAFT_EXTEND``, which sglang lacks)."""
    return api().ForwardMode.__members__.get(mode.name)


def warcore_mode(mode: Any) -> ForwardMode:
    return ForwardMode.parse(mode.name)


def sglang_algorithm(name: str) -> Any | None:
    """warcore's algorithm name -> sglang's algorithm object (``none`` -> ``NONE``); ``None``
    for a name that is not sglang's (the reference engine's ``eagle``, say)."""
    algo = api().SpeculativeAlgorithm
    if name == "none":
        return algo.NONE
    if not name.startswith(PREFIX):
        return None
    upper = name[len(PREFIX) :].upper()
    if upper == "NONE":
        return None  # NONE is warcore's 'none', never 'sglang_none'
    member = algo.__members__.get(upper)
    if member is not None:
        return member
    return api().spec_registry.get_spec(upper)


def warcore_algorithm(algo: Any) -> str | None:
    """sglang's algorithm (a ``SpeculativeAlgorithm``, a ``CustomSpecAlgo`` or its name) ->
    warcore's name; ``None`` when the name cannot be a warcore name."""
    name = algo if isinstance(algo, str) else getattr(algo, "name", None)
    if not isinstance(name, str):
        return None
    warcore = algorithm_to_warcore(name)
    try:
        return validate_name("algorithm", warcore)
    except ValueError:
        return None


# -- declarations: a backend name and a context -> a bare object tree ----------------------


def _bare(cls: type, **attrs: Any) -> Any:
    obj: Any = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def _children(name: str, context: BoundaryContext) -> list[str]:
    shape = WRAPPERS[name]
    return [
        entry[1:] if entry.startswith("=") else child_name(flag_value(context.flags, entry))
        for entry in shape.children
    ]


def _bare_wrapper(
    name: str, cls: type, kids: list[Any], context: BoundaryContext, **attrs: Any
) -> Any:
    """A bare wrapper holding ``kids`` where sglang's wrapper class keeps its children (the
    wrapper table says where), with its switches set from ``context``'s flags."""
    shape = WRAPPERS[name]
    for flag, attr in shape.switches:
        attrs[attr] = bool(flag_value(context.flags, flag))
    return _bare(cls, **shape.attributes(kids), **attrs)


def build(name: str, context: BoundaryContext, algo: Any, depth: int = 0) -> Any | None:
    """A bare instance of the class behind ``name`` (with bare children, as ``context``'s
    flags name them), or ``None`` when that class cannot be imported here."""
    if depth > MAX_DEPTH:
        raise ValueError(f"backend {name!r}: wrappers nest deeper than {MAX_DEPTH} (a cycle?)")
    cls, _ = class_for(name)
    if cls is None:
        return None
    runner = SimpleNamespace(spec_algorithm=algo)  # what dsv4 reads
    if name not in WRAPPERS:
        # no batch's metadata: a declaration that depends on it per batch (0.5.21's and
        # 0.5.22's dsv4 EXTEND, PRE_REPLAY only after its own snapshot) answers its static part
        return _bare(cls, model_runner=runner, forward_metadata=None)
    kids = [build(child, context, algo, depth + 1) for child in _children(name, context)]
    if any(k is None for k in kids):
        return None
    return _bare_wrapper(name, cls, kids, context, model_runner=runner)


def declare(name: str, mode: ForwardMode, context: BoundaryContext) -> SharedReadBoundary | None:
    """What sglang's own code declares for backend ``name`` in ``mode`` under ``context``;
    ``None`` where it cannot be asked here (a class that does not import; an algorithm or a
    mode sglang does not have)."""
    algo = sglang_algorithm(context.algorithm)
    smode = sglang_mode(mode)
    if algo is None or smode is None:
        return None
    obj = build(name, context, algo)
    if obj is None:
        return None
    with in_tree():
        ends = type(obj).shared_read_ends(obj, smode)
    return boundary_of(ends)


def children_for(name: str, mode: ForwardMode, context: BoundaryContext) -> tuple[str, ...]:
    """The children a wrapper runs in ``mode`` (by name): all of them, or for the hybrid the
    one sglang's own ``HybridAttnBackend._select_backend`` picks."""
    kids = _children(name, context)
    if WRAPPERS[name].selecting:
        smode = sglang_mode(mode)
        cls, _ = class_for(name)
        if smode is None or cls is None:
            return ()
        bare = _bare_wrapper(name, cls, kids, context)
        with in_tree():
            kids = [original(cls, "_select_backend")(bare, smode)]
    out: list[str] = []
    for kid in kids:
        if kid != name and kid not in out:
            out.append(kid)
    return tuple(out)


# -- publish phase and event owner ---------------------------------------------------------


def publish_phase(algorithm: str, mode: ForwardMode) -> bool | None:
    """``EXTEND``: sglang's prefill gate, ``supports_prefill_shared_read_done()``. Other modes:
    ``True`` for sglang's algorithms, because in no audited release does a runner gate a
    decode, a verify or a draft-extend on the algorithm: each publishes what its backend
    declares (0.5.21's draft-extend runner publishes regardless: the owner closes it), and which
    runner's event the barrier takes is the event owner's business
    (``last_shared_read_runner``). For ``none`` only ``DECODE`` (the rest is the core's)."""
    algo = sglang_algorithm(algorithm)
    if algo is None:
        return None
    if mode is ForwardMode.EXTEND:
        with in_tree():
            return bool(original(type(algo), "supports_prefill_shared_read_done")(algo))
    if algorithm == "none":
        return True if mode is ForwardMode.DECODE else None
    if sglang_mode(mode) is None:
        return None
    return True


def _worker_class(algo: Any, facts: StepFacts) -> type:
    if algo is api().SpeculativeAlgorithm.NONE:
        return _import(SRT + "managers.tp_worker").TpModelWorker  # type: ignore[no-any-return]
    # sglang's own choice; multi-layer EAGLE is the worker whose draft-extend can be staged.
    # (A custom algorithm without overlap support refuses overlap scheduling: say it is off.)
    args = SimpleNamespace(
        enable_multi_layer_eagle=facts.draft_extend_staged,
        disable_overlap_schedule=not getattr(algo, "supports_overlap", True),
    )
    with contextlib.redirect_stdout(sys.stderr):
        return algo.create_worker(args)  # type: ignore[no-any-return]


def event_owner(algorithm: str, facts: StepFacts) -> str | None:
    """``"target"`` or ``"draft"``: which runner sglang's worker class for ``algorithm``
    returns from ``last_shared_read_runner`` for these facts, asked of a bare worker; ``None``
    when the algorithm is not sglang's. Raises where its worker class cannot be had here (an
    import a GPU build provides, a custom factory that needs real server args): a failure,
    which the core turns into no owner (the coarse barrier), never its default ``target``."""
    algo = sglang_algorithm(algorithm)
    if algo is None:
        return None
    try:
        worker_cls = _worker_class(algo, facts)
    except Exception as exc:  # uno (flashinfer), ngram (sgl_kernel): a GPU build's imports
        raise RuntimeError(
            f"sglang's worker for {algorithm} cannot be imported here ({type(exc).__name__}: "
            f"{exc}): its event owner is unknown (no owner: coarse barrier)"
        ) from None
    prop = original(worker_cls, "last_shared_read_runner")
    target = SimpleNamespace(role="target", spec_algorithm=algo, shared_read_done_event=None)
    draft = SimpleNamespace(role="draft", spec_algorithm=algo, shared_read_done_event=None)
    staged = facts.draft_extend_staged
    drafter = (
        SimpleNamespace(draft_runner=draft, model_runner=draft, last_draft_extend_staged=staged)
        if facts.has_draft_model
        else None
    )
    worker = _bare(
        worker_cls,
        _model_runner=target,
        _target_worker=SimpleNamespace(model_runner=target),
        _draft_worker=drafter,
    )
    with in_tree():
        runner = prop.fget(worker)
    if runner is target:
        return "target"
    if runner is draft:
        return "draft"
    raise ValueError(f"{worker_cls.__qualname__}.last_shared_read_runner returned {runner!r}")
