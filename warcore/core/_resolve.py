"""Resolving plugin answers into one boundary, publish phase, veto list or event owner, with
provenance.

Each hookimpl is asked on its own (:func:`_poll`): pluggy's ``firstresult`` would let
registration order decide and would let one raising plugin abort the call for everybody. One
vote (:func:`_vote`) turns the answers into a decision for every resolver: a failure is doubt
(the coarse fence, blamed on the plugin), plugins that disagree are a conflict (resolved to the
safe side, logged once), plugins that agree decide, and nobody answering leaves the resolver's
own default.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ._boundary import Declared, SharedReadBoundary, latest
from ._config import ENV_PREFILL_FAST_PATH
from ._diagnostics import PLUGIN_ERRORS, failure_text
from ._manager import WarcorePluginManager, get_plugin_manager
from ._modes import CAPTURED_MODES, CONTRACT_MODES, ForwardMode
from ._registry import get_registry
from ._scope import stale_reason
from ._select import BUILTIN_PLUGIN_NAME
from ._specs import EVENT_OWNERS, Backend, BoundaryContext, StepFacts
from ._steps import StepSpec

__all__ = [
    "BoundaryResolution",
    "OwnerResolution",
    "PluginFailure",
    "PublishResolution",
    "VetoResolution",
    "resolve_fast_path_veto",
    "resolve_shared_read_boundary",
    "resolve_step_event_owner",
    "resolve_war_publish_phase",
]

T = TypeVar("T")
UNKNOWN = SharedReadBoundary.UNKNOWN


@dataclass(frozen=True)
class PluginFailure:
    """A hookimpl that raised or answered with the wrong type."""

    plugin: str
    hook: str
    error: str


@dataclass(frozen=True)
class BoundaryResolution:
    """The resolved boundary of (backend, mode, context) and where it came from.

    ``source`` is one of ``plugin:<name>``, ``contract:<name>`` (the backend's spec declares
    that it follows the metadata contract in this mode), ``default:no-answer``,
    ``default:failed:<name>``, ``default:conflict``, ``forced-coarse``; a wrapper backend
    carries its children's resolutions and the source of the child that decided.
    """

    backend: str
    forward_mode: ForwardMode
    context: BoundaryContext
    boundary: SharedReadBoundary
    source: str
    answers: tuple[tuple[str, SharedReadBoundary], ...] = ()
    failures: tuple[PluginFailure, ...] = ()
    children: tuple[BoundaryResolution, ...] = ()

    @property
    def conflict(self) -> bool:
        """Plugins disagree here or in a child."""
        return self.own_conflict or any(c.conflict for c in self.children)

    @property
    def own_conflict(self) -> bool:
        """Plugins disagree on this backend's own declaration (not a child's)."""
        return len({b for _, b in self.answers}) > 1


@dataclass(frozen=True)
class PublishResolution:
    """Whether ``forward_mode`` is ``algorithm``'s publish phase, and where that came from."""

    algorithm: str
    forward_mode: ForwardMode
    publishes: bool
    source: str
    answers: tuple[tuple[str, bool], ...] = ()
    failures: tuple[PluginFailure, ...] = ()

    @property
    def conflict(self) -> bool:
        return self.source == "default:conflict"


@dataclass(frozen=True)
class VetoResolution:
    """Whether anyone vetoes the fine fence for (mode, context), who and why."""

    forward_mode: ForwardMode
    context: BoundaryContext
    vetoes: tuple[tuple[str, str], ...] = ()
    """(plugin, reason) of every veto, failures included."""
    failures: tuple[PluginFailure, ...] = ()

    @property
    def vetoed(self) -> bool:
        return bool(self.vetoes)

    @property
    def source(self) -> str:
        """``veto:<plugin>: <reason>`` of the first veto; empty when nobody vetoes."""
        if not self.vetoes:
            return ""
        plugin, reason = self.vetoes[0]
        return f"veto:{plugin}: {reason}"


@dataclass(frozen=True)
class OwnerResolution:
    """Which runner owns the step's read-done event for (algorithm, facts); ``None``: no owner
    (the barrier keeps the coarse fence)."""

    algorithm: str
    facts: StepFacts
    owner: str | None
    source: str
    answers: tuple[tuple[str, str], ...] = ()
    failures: tuple[PluginFailure, ...] = ()


# -- asking and voting -------------------------------------------------------------------------

Answers = list[tuple[str, Any]]


@dataclass(frozen=True)
class _Question(Generic[T]):
    """A hook as the core asks it: what an answer must be, and what doubt decides."""

    hook: str
    accept: Callable[[object], bool]
    expected: str
    doubt: T
    """The decision when a plugin fails (or a declaration is stale): the coarse fence."""
    failed: str
    """What a failure costs, for the log."""
    conflict: Callable[[list[Any]], tuple[T, str]]
    """Answers that disagree: the decision, and what it means for the log."""


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` for a log line: cut at ``limit`` characters, and never raising (a
    plugin's object may raise in its ``__repr__``; the line must still name the plugin)."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<a {type(value).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _accepts(question: _Question[Any], value: object) -> bool:
    """``question.accept(value)``; a value whose comparison raises is not an answer."""
    try:
        return bool(question.accept(value))
    except Exception:
        return False


def _poll(
    pm: WarcorePluginManager,
    question: _Question[Any],
    kwargs: Mapping[str, Any],
    taking_eager: bool | None = None,
) -> tuple[Answers, list[PluginFailure]]:
    """Ask each hookimpl on its own; ``taking_eager`` narrows to those whose signature takes
    (True) or lacks (False) the ``eager`` argument."""
    answers: Answers = []
    failures: list[PluginFailure] = []
    hook = question.hook
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if taking_eager is not None and ("eager" in impl.argnames) is not taking_eager:
            continue
        try:
            value = pm.call_hookimpl(hook, impl, kwargs)
        except PLUGIN_ERRORS as exc:
            failures.append(PluginFailure(impl.plugin_name, hook, failure_text(exc)))
            continue
        if value is None:
            continue
        if not _accepts(question, value):
            error = f"returned {shown(value)} ({type(value).__name__}); expected "
            failures.append(
                PluginFailure(impl.plugin_name, hook, f"{error}{question.expected} or None")
            )
            continue
        answers.append((impl.plugin_name, value))
    return answers, failures


def _vote(
    pm: WarcorePluginManager,
    question: _Question[T],
    answers: Answers,
    failures: list[PluginFailure],
    where: str,
    conflict_key: object,
    *,
    disagree_on: str | None = None,
    stale: list[str] | None = None,
) -> tuple[T, str] | None:
    """The decision of ``answers``, and its provenance: a failure (logged once) or a stale
    declaration is the question's doubt; answers that disagree are its conflict (logged once
    per ``conflict_key``); agreeing answers decide (``plugin:<a+b>``); ``None`` when nobody
    answered."""
    if failures:
        _log_failures(pm, failures, where, question.failed)
        return question.doubt, f"default:failed:{failures[0].plugin}"
    if stale:
        return question.doubt, stale[0]
    values = [v for _, v in answers]
    if len(set(values)) > 1:
        value, meaning = question.conflict(values)
        who = ", ".join(f"{p}={_shown(v)}" for p, v in answers)
        message = f"plugins disagree on {disagree_on or where}: {who}; {meaning}"
        pm.log_once(conflict_key, logging.WARNING, message)
        return value, "default:conflict"
    if values:
        answerers = sorted({p for p, _ in answers if not p.startswith("step:")})
        return values[0], "plugin:" + "+".join(answerers)
    return None


def _shown(value: object) -> str:
    return value.name if isinstance(value, enum.Enum) else str(value)


def _log_failures(
    pm: WarcorePluginManager, failures: list[PluginFailure], where: str, consequence: str
) -> None:
    """Each failure once per process per (plugin, hook, error), naming what it cost."""
    for f in failures:
        pm.log_once(
            ("failed", f.plugin, f.hook, f.error),
            logging.WARNING,
            f"plugin {f.plugin!r} hook {f.hook!r} failed for {where}: {f.error}; {consequence}",
        )


# -- the boundary --------------------------------------------------------------------------------


def resolve_shared_read_boundary(
    backend: str | Backend,
    forward_mode: ForwardMode | str,
    context: BoundaryContext | None = None,
    *,
    eager: bool = False,
    pm: WarcorePluginManager | None = None,
) -> BoundaryResolution:
    """Resolve where ``backend``'s last shared read ends in ``forward_mode``.

    ``backend`` is a backend name or instance. A wrapper (an instance whose
    ``children_for(mode, context)`` is not empty, or a name whose :class:`BackendSpec` has
    ``children_for``) resolves to the latest of those children and of its own declaration.
    ``eager``: the forward runs uncaptured (see the hookspec). Not for the hot path: runners
    resolve once through :class:`~warcore.core.DecisionCache`.
    """
    pm = pm if pm is not None else get_plugin_manager()
    mode = ForwardMode.parse(forward_mode)
    ctx = context if context is not None else BoundaryContext()
    if not isinstance(ctx, BoundaryContext):
        raise TypeError(
            f"context must be a warcore.BoundaryContext, got {type(ctx).__name__} {ctx!r}; "
            "build one with BoundaryContext(algorithm, {flag: value})"
        )
    return _resolve(pm, backend, mode, ctx, eager, ())


_Path = tuple[tuple[object, str, str], ...]
"""The wrappers above a backend being resolved: (identity, name, owner) of each."""


def _resolve(
    pm: WarcorePluginManager,
    backend: str | Backend,
    mode: ForwardMode,
    ctx: BoundaryContext,
    eager: bool,
    outer: _Path,
) -> BoundaryResolution:
    name, children, failure, owner = _backend_identity(pm, backend, mode, ctx)
    if pm.config.force_coarse:
        return BoundaryResolution(name, mode, ctx, UNKNOWN, "forced-coarse")
    inner = (*outer, (_identity(backend), name, owner))
    if failure is None:
        failure = _cycle(children, inner)
    if failure is not None:
        pm.log_once(
            ("failed", failure.plugin, failure.hook, failure.error),
            logging.WARNING,
            f"{failure.plugin} {failure.hook} failed for backend {name!r}, mode {mode.name}: "
            f"{failure.error}; treated as UNKNOWN (coarse fence)",
        )
        source = f"default:failed:{failure.plugin}"
        return BoundaryResolution(name, mode, ctx, UNKNOWN, source, failures=(failure,))
    own = _declared(pm, name, mode, ctx, eager, wrapper=bool(children))
    if not children:
        return own
    resolved = tuple(_resolve(pm, c, mode, ctx, eager, inner) for c in children)
    parts = resolved if own.source == "default:no-answer" else (own, *resolved)
    boundary = latest(r.boundary for r in parts)
    decider = next(r for r in parts if r.boundary is boundary)
    return BoundaryResolution(
        name, mode, ctx, boundary, decider.source, own.answers, own.failures, resolved
    )


def _identity(backend: object) -> object:
    """What makes two backends of a wrapper tree the same one: a name is compared by value
    (``children_for`` builds names at run time), a built backend by identity."""
    return backend if isinstance(backend, str) else id(backend)


def _cycle(children: tuple[Any, ...], path: _Path) -> PluginFailure | None:
    """A child that is one of the wrappers on ``path`` (itself included): a cycle, the fault
    of the plugins that offer the wrappers on it. Described the same from wherever it is
    entered, so ``check`` shows one cycle once."""
    keys = [key for key, _, _ in path]
    for child in children:
        if _identity(child) in keys:
            loop = path[keys.index(_identity(child)) :]
            names = [n for _, n, _ in loop]
            first = names.index(min(names))
            names = names[first:] + names[:first]
            owners = "+".join(sorted({o for _, _, o in loop}))
            shape = " -> ".join([*names, names[0]])
            return PluginFailure(owners, "children_for", f"wrapper backends form a cycle: {shape}")
    return None


_BOUNDARY = _Question(
    "warcore_shared_read_boundary",
    lambda v: isinstance(v, SharedReadBoundary | Declared),
    "SharedReadBoundary or Declared",
    UNKNOWN,
    "treated as UNKNOWN (coarse fence)",
    lambda values: (latest(values), f"using the latest, {latest(values).name}"),
)
_PUBLISH = _Question(
    "warcore_is_war_publish_phase",
    lambda v: isinstance(v, bool),
    "bool",
    False,
    "not publishing (coarse fence)",
    lambda _: (False, "not publishing (coarse fence)"),
)
_VETO: _Question[None] = _Question(
    "warcore_fast_path_veto",
    lambda v: isinstance(v, str) and bool(v.strip()),
    "a non-empty reason string",
    None,
    "counted as a veto (coarse fence)",
    lambda _: (None, ""),  # not a vote: every answer is a veto
)
_OWNER: _Question[str | None] = _Question(
    "warcore_step_event_owner",
    lambda v: v in EVENT_OWNERS,
    " or ".join(repr(o) for o in EVENT_OWNERS),
    None,
    "no event owner (coarse fence)",
    lambda _: (None, "no owner (coarse)"),
)


def _declared(
    pm: WarcorePluginManager,
    name: str,
    mode: ForwardMode,
    ctx: BoundaryContext,
    eager: bool,
    *,
    wrapper: bool,
) -> BoundaryResolution:
    """One backend's own declaration (a wrapper's own, without its children)."""
    eager_only = eager and mode in CAPTURED_MODES
    kwargs = {"backend": name, "forward_mode": mode, "context": ctx, "eager": eager}
    answers, failures = _poll(pm, _BOUNDARY, kwargs, True if eager_only else None)
    if eager_only:
        # A graph-only declaration says nothing about the eager body, except that an UNKNOWN
        # (not audited) or a failure is never overruled by someone else's eager claim.
        graph, graph_failures = _poll(pm, _BOUNDARY, kwargs, False)
        answers += [(p, v) for p, v in graph if _boundary_of(v) is UNKNOWN]
        failures += graph_failures
    where = f"backend {name!r}, mode {mode.name}, algorithm {ctx.algorithm!r}" + (
        " (eager)" if eager_only else ""
    )
    answers, stale = _drop_stale(pm, answers, where)
    key = ("conflict", name, mode, ctx, eager_only)
    decided = _vote(pm, _BOUNDARY, answers, failures, where, key, stale=stale)
    boundary, source = decided or _undeclared(pm, name, mode, ctx, eager_only, wrapper, where)
    return BoundaryResolution(name, mode, ctx, boundary, source, tuple(answers), tuple(failures))


def _undeclared(
    pm: WarcorePluginManager,
    name: str,
    mode: ForwardMode,
    ctx: BoundaryContext,
    eager_only: bool,
    wrapper: bool,
    where: str,
) -> tuple[SharedReadBoundary, str]:
    """Nobody declares: an eager forward takes its graph's (never earlier than after the
    whole forward), a contract-following backend's spec says ``IN_REPLAY``, else ``UNKNOWN``."""
    if eager_only:
        graph = _declared(pm, name, mode, ctx, False, wrapper=wrapper)
        # A declaration is audited for the captured graph; the eager body may read later.
        if graph.boundary is UNKNOWN:
            return UNKNOWN, graph.source
        return SharedReadBoundary.POST_REPLAY, "default:eager"
    if not wrapper and (declarer := _contract_declarer(pm, name, mode)) is not None:
        return SharedReadBoundary.IN_REPLAY, f"contract:{declarer}"
    pm.log_once(
        ("no-answer", name, mode, ctx, eager_only),
        logging.DEBUG,
        f"no plugin declares {where}: UNKNOWN (coarse fence)",
    )
    return UNKNOWN, "default:no-answer"


def _boundary_of(value: SharedReadBoundary | Declared) -> SharedReadBoundary:
    return value.boundary if isinstance(value, Declared) else value


def _drop_stale(
    pm: WarcorePluginManager, answers: Answers, where: str
) -> tuple[list[tuple[str, SharedReadBoundary]], list[str]]:
    """Unwrap :class:`Declared` answers; those outside their implementation range are stale."""
    kept: list[tuple[str, SharedReadBoundary]] = []
    stale: list[str] = []
    for plugin, value in answers:
        if isinstance(value, Declared):
            why = stale_reason(value.implementation)
            if why is not None:
                stale.append(f"stale:{plugin}")
                pm.log_once(
                    ("stale", plugin, value.implementation),
                    logging.WARNING,
                    f"plugin {plugin!r}: its declaration for {where} is stale: {why}; "
                    "not applied (coarse fence)",
                )
                continue
            value = value.boundary
        kept.append((plugin, value))
    return kept, stale


def _backend_identity(
    pm: WarcorePluginManager, backend: str | Backend, mode: ForwardMode, ctx: BoundaryContext
) -> tuple[str, tuple[Any, ...], PluginFailure | None, str]:
    """The backend's name, the children whose shared reads run in ``mode``, the failure of a
    wrapper's ``children_for`` (a raise, or a child that is neither a backend name nor a
    backend), and who answers for that code: the plugin offering the spec for a name,
    ``backend:<name>`` for a built backend's own method."""
    name, owner, ask = _children_asker(pm, backend, mode, ctx)
    if ask is None:
        return name, (), None, owner
    try:
        answer = pm.call_as(owner, "children_for", ask)
        if isinstance(answer, str):
            raise TypeError(f"returned the string {answer!r}, not a sequence of backend names")
        children = tuple(answer)
    except PLUGIN_ERRORS as exc:
        return name, (), PluginFailure(owner, "children_for", failure_text(exc)), owner
    for child in children:
        if not isinstance(child, str) and not isinstance(getattr(child, "name", None), str):
            error = (
                f"named {child!r} ({type(child).__name__}) as a child of {name!r}: not a "
                "backend name or a backend"
            )
            return name, (), PluginFailure(owner, "children_for", error), owner
    return name, children, None, owner


def _children_asker(
    pm: WarcorePluginManager, backend: str | Backend, mode: ForwardMode, ctx: BoundaryContext
) -> tuple[str, str, Callable[[], Any] | None]:
    """(name, owner, the call naming its children, or ``None`` for a plain backend)."""
    if isinstance(backend, str):
        offer = get_registry(pm).backends.get(backend)
        compose = offer.spec.children_for if offer is not None else None
        if offer is None or compose is None:
            return backend, f"backend:{backend}", None
        return backend, offer.plugin, lambda: compose(mode, ctx)
    found = getattr(backend, "name", None)
    if not isinstance(found, str):
        raise TypeError(f"backend {backend!r} has no string 'name'")
    children_for = getattr(backend, "children_for", None)
    legacy = getattr(backend, "children", None)
    if callable(children_for):
        return found, f"backend:{found}", lambda: children_for(mode, ctx)
    return found, f"backend:{found}", legacy if callable(legacy) else None


def _contract_declarer(pm: WarcorePluginManager, name: str, mode: ForwardMode) -> str | None:
    """The plugin whose :class:`BackendSpec` for ``name`` declares that the backend follows
    the metadata contract in ``mode`` (``BackendSpec.follows_contract``); ``None``: nobody
    does, and being an ``AttentionBackend`` is no declaration (sglang #37936)."""
    if mode not in CONTRACT_MODES:
        return None
    offer = get_registry(pm).backends.get(name)
    if offer is None or mode not in offer.spec.follows_contract:
        return None
    return offer.plugin


# -- the publish phase, the vetoes, the event owner ---------------------------------------------


def resolve_war_publish_phase(
    algorithm: str,
    forward_mode: ForwardMode | str,
    *,
    pm: WarcorePluginManager | None = None,
) -> PublishResolution:
    """Resolve whether ``forward_mode`` is the step's last shared reader for ``algorithm``.

    Anything doubtful (failures, disagreement) resolves to ``False``: not publishing keeps the
    coarse fence, which is always safe. With no answer at all, an algorithm that declares a
    :class:`~warcore.StepSpec` answers from it (``step:<plugin>``); others resolve to ``False``.
    A plugin answering for an algorithm that another plugin defines by its step alone does
    not override the step: the step counts as its definer's answer, and a disagreement is a
    conflict (``False``).
    """
    pm = pm if pm is not None else get_plugin_manager()
    mode = ForwardMode.parse(forward_mode)
    if pm.config.force_coarse:
        return PublishResolution(algorithm, mode, False, "forced-coarse")
    answers, failures = _poll(pm, _PUBLISH, {"algorithm": algorithm, "forward_mode": mode})
    stepped = _declared_step(pm, algorithm)
    if stepped is not None:
        answers += _step_answer(answers, stepped[1], mode in stepped[0].publish_modes)
    where = f"algorithm {algorithm!r}, mode {mode.name}"
    decided = _vote(pm, _PUBLISH, answers, failures, where, ("conflict", algorithm, mode))
    if decided is None:  # nobody answers: an algorithm that declares its step answers from it
        decided = (
            (False, "default:no-answer")
            if stepped is None
            else (mode in stepped[0].publish_modes, f"step:{stepped[1]}")
        )
    publishes, source = decided
    return PublishResolution(algorithm, mode, publishes, source, tuple(answers), tuple(failures))


def _step_answer(answers: Answers, definer: str, says: Any) -> Answers:
    """What the algorithm's own step says, as an answer of the plugin that defines it, where
    other plugins answer a hook about the algorithm and its definer's hook does not: another
    plugin's answer never overrides the algorithm's own, it conflicts with it (issue 17)."""
    if not answers or any(plugin == definer for plugin, _ in answers):
        return []
    return [(f"step:{definer}", says)]


def _declared_step(pm: WarcorePluginManager, algorithm: str) -> tuple[StepSpec, str] | None:
    """The step ``algorithm``'s :class:`AlgorithmSpec` declares, and the plugin offering it."""
    offer = get_registry(pm).algorithms.get(algorithm)
    if offer is None or offer.spec.step is None:
        return None
    return offer.spec.step, offer.plugin


def resolve_fast_path_veto(
    forward_mode: ForwardMode | str,
    context: BoundaryContext | None = None,
    *,
    pm: WarcorePluginManager | None = None,
) -> VetoResolution:
    """Every veto of the fine fence for (mode, context): the core's switches, then plugins'.

    A failing veto hook counts as a veto: the doubt keeps the coarse fence.
    """
    pm = pm if pm is not None else get_plugin_manager()
    mode = ForwardMode.parse(forward_mode)
    ctx = context if context is not None else BoundaryContext()
    vetoes: list[tuple[str, str]] = []
    if mode is ForwardMode.EXTEND and not pm.config.prefill_fast_path:
        why = f"the prefill fast path is switched off ({ENV_PREFILL_FAST_PATH})"
        vetoes.append((BUILTIN_PLUGIN_NAME, why))
    answers, failures = _poll(pm, _VETO, {"forward_mode": mode, "context": ctx})
    # Not a vote: every answer is a veto, and so is every failure.
    vetoes.extend(answers)
    vetoes.extend((f"failed:{f.plugin}", f.error) for f in failures)
    _log_failures(pm, failures, f"mode {mode.name}", _VETO.failed)
    return VetoResolution(mode, ctx, tuple(vetoes), tuple(failures))


def resolve_step_event_owner(
    algorithm: str,
    facts: StepFacts | None = None,
    *,
    pm: WarcorePluginManager | None = None,
) -> OwnerResolution:
    """Resolve the step's event owner; nobody answering → the owner the algorithm's
    :class:`~warcore.StepSpec` declares (``step:<plugin>``), else ``"target"`` (sglang's
    default). Another plugin's answer for an algorithm defined by its step alone counts beside
    the step's owner: if they disagree, no owner (the coarse fence)."""
    pm = pm if pm is not None else get_plugin_manager()
    facts = facts if facts is not None else StepFacts()
    if not isinstance(facts, StepFacts):
        raise TypeError(f"facts must be a warcore.StepFacts, got {facts!r}")
    answers, failures = _poll(pm, _OWNER, {"algorithm": algorithm, "facts": facts})
    stepped = _declared_step(pm, algorithm)  # the step's last reader's runner (issue 14)
    if stepped is not None:
        answers += _step_answer(answers, stepped[1], stepped[0].owner)
    key = ("owner-conflict", algorithm, facts)
    decided = _vote(
        pm,
        _OWNER,
        answers,
        failures,
        f"algorithm {algorithm!r}",
        key,
        disagree_on=f"the event owner of {algorithm!r}",
    )
    if decided is None:
        step_owner = None if stepped is None else (stepped[0].owner, f"step:{stepped[1]}")
        decided = step_owner or ("target", "default:target")
    owner, source = decided
    return OwnerResolution(algorithm, facts, owner, source, tuple(answers), tuple(failures))
