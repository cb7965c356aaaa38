"""Resolving plugin answers into one boundary / publish phase, with provenance.

Each hookimpl is asked on its own: pluggy's ``firstresult`` would let registration order decide
and would let one raising plugin abort the call for everybody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._boundary import Declared, SharedReadBoundary, latest
from ._manager import (
    BUILTIN_PLUGIN_NAME as BUILTIN,
)
from ._manager import (
    ENV_PREFILL_FAST_PATH as ENV_PREFILL,
)
from ._manager import (
    WarcorePluginManager,
    get_plugin_manager,
)
from ._modes import CAPTURED_MODES, CONTRACT_MODES, ForwardMode
from ._registry import get_registry
from ._scope import stale_reason
from ._specs import EVENT_OWNERS, BoundaryContext, StepFacts
from ._steps import StepSpec

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

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


def _ask(
    pm: WarcorePluginManager,
    hook: str,
    kwargs: dict[str, Any],
    accept: Callable[[object], bool],
    expected: str,
    taking_eager: bool | None = None,
) -> tuple[list[tuple[str, Any]], list[PluginFailure]]:
    """Ask each hookimpl on its own; ``taking_eager`` narrows to those whose signature takes
    (True) or lacks (False) the ``eager`` argument."""
    answers: list[tuple[str, Any]] = []
    failures: list[PluginFailure] = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if taking_eager is not None and ("eager" in impl.argnames) is not taking_eager:
            continue
        try:
            args = {name: kwargs[name] for name in impl.argnames}
            value = pm.call_as(impl.plugin_name, hook, impl.function, **args)
        except Exception as exc:
            failures.append(PluginFailure(impl.plugin_name, hook, f"{type(exc).__name__}: {exc}"))
            continue
        if value is None:
            continue
        if not accept(value):
            failures.append(
                PluginFailure(
                    impl.plugin_name,
                    hook,
                    f"returned {value!r} ({type(value).__name__}); expected {expected} or None",
                )
            )
            continue
        answers.append((impl.plugin_name, value))
    return answers, failures


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


def _source_of_answers(names: list[str]) -> str:
    return "plugin:" + "+".join(sorted(set(names)))


def resolve_shared_read_boundary(
    backend: str | AttentionBackend,
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
    backend: str | AttentionBackend,
    mode: ForwardMode,
    ctx: BoundaryContext,
    eager: bool,
    outer: _Path,
) -> BoundaryResolution:
    name, children, failure, owner = _backend_identity(pm, backend, mode, ctx)
    if pm.config.force_coarse:
        return BoundaryResolution(name, mode, ctx, SharedReadBoundary.UNKNOWN, "forced-coarse")
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
        return BoundaryResolution(
            name, mode, ctx, SharedReadBoundary.UNKNOWN, source, failures=(failure,)
        )
    own = _declared(pm, backend, name, mode, ctx, eager, wrapper=bool(children))
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


def _declared(
    pm: WarcorePluginManager,
    backend: str | AttentionBackend,
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
    accept = lambda v: isinstance(v, SharedReadBoundary | Declared)  # noqa: E731
    expected = "SharedReadBoundary or Declared"
    hook = "warcore_shared_read_boundary"
    if not eager_only:
        answers, failures = _ask(pm, hook, kwargs, accept, expected)
    else:
        answers, failures = _ask(pm, hook, kwargs, accept, expected, taking_eager=True)
        # A graph-only declaration says nothing about the eager body, except that an UNKNOWN
        # (not audited) or a failure is never overruled by someone else's eager claim.
        graph_answers, graph_failures = _ask(pm, hook, kwargs, accept, expected, taking_eager=False)
        answers += [(p, v) for p, v in graph_answers if _boundary_of(v) is UNKNOWN]
        failures += graph_failures
    where = f"backend {name!r}, mode {mode.name}, algorithm {ctx.algorithm!r}" + (
        " (eager)" if eager_only else ""
    )
    answers, stale = _drop_stale(pm, answers, where)
    values = [v for _, v in answers]
    if failures:
        boundary, source = SharedReadBoundary.UNKNOWN, f"default:failed:{failures[0].plugin}"
        _log_failures(pm, failures, where, "treated as UNKNOWN (coarse fence)")
    elif stale:
        boundary, source = SharedReadBoundary.UNKNOWN, stale[0]
    elif len(set(values)) > 1:
        boundary, source = latest(values), "default:conflict"
        who = ", ".join(f"{p}={v.name}" for p, v in answers)
        pm.log_once(
            ("conflict", name, mode, ctx, eager_only),
            logging.WARNING,
            f"plugins disagree on {where}: {who}; using the latest, {boundary.name}",
        )
    elif values:
        boundary, source = values[0], _source_of_answers([p for p, _ in answers])
    elif eager_only:
        graph = _declared(pm, backend, name, mode, ctx, False, wrapper=wrapper)
        # A declaration is audited for the captured graph; the eager body may read later.
        if graph.boundary is SharedReadBoundary.UNKNOWN:
            boundary, source = SharedReadBoundary.UNKNOWN, graph.source
        else:
            boundary, source = SharedReadBoundary.POST_REPLAY, "default:eager"
    elif not wrapper and (declarer := _contract_declarer(pm, name, mode)) is not None:
        boundary, source = SharedReadBoundary.IN_REPLAY, f"contract:{declarer}"
    else:
        boundary, source = SharedReadBoundary.UNKNOWN, "default:no-answer"
        pm.log_once(
            ("no-answer", name, mode, ctx, eager_only),
            logging.DEBUG,
            f"no plugin declares {where}: UNKNOWN (coarse fence)",
        )
    return BoundaryResolution(name, mode, ctx, boundary, source, tuple(answers), tuple(failures))


UNKNOWN = SharedReadBoundary.UNKNOWN


def _boundary_of(value: SharedReadBoundary | Declared) -> SharedReadBoundary:
    return value.boundary if isinstance(value, Declared) else value


def _drop_stale(
    pm: WarcorePluginManager, answers: list[tuple[str, Any]], where: str
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
    answers, failures = _ask(
        pm,
        "warcore_is_war_publish_phase",
        {"algorithm": algorithm, "forward_mode": mode},
        lambda v: isinstance(v, bool),
        "bool",
    )
    stepped = _declared_step(pm, algorithm)
    if stepped is not None:
        answers += _step_answer(answers, stepped[1], mode in stepped[0].publish_modes)
    values = {v for _, v in answers}
    where = f"algorithm {algorithm!r}, mode {mode.name}"
    if failures:
        publishes, source = False, f"default:failed:{failures[0].plugin}"
        _log_failures(pm, failures, where, "not publishing (coarse fence)")
    elif len(values) > 1:
        publishes, source = False, "default:conflict"
        who = ", ".join(f"{p}={v}" for p, v in answers)
        pm.log_once(
            ("conflict", algorithm, mode),
            logging.WARNING,
            f"plugins disagree on {where}: {who}; not publishing (coarse fence)",
        )
    elif values:
        publishes, source = values.pop(), _source_of_answers(_hook_answerers(answers))
    else:
        # Nobody answers: an algorithm that declares its step answers from it (issue 14).
        if stepped is None:
            publishes, source = False, "default:no-answer"
        else:
            publishes, source = mode in stepped[0].publish_modes, f"step:{stepped[1]}"
    return PublishResolution(algorithm, mode, publishes, source, tuple(answers), tuple(failures))


def _step_answer(answers: list[tuple[str, Any]], definer: str, says: Any) -> list[tuple[str, Any]]:
    """What the algorithm's own step says, as an answer of the plugin that defines it, where
    other plugins answer a hook about the algorithm and its definer's hook does not: another
    plugin's answer never overrides the algorithm's own, it conflicts with it (issue 17)."""
    if not answers or any(plugin == definer for plugin, _ in answers):
        return []
    return [(f"step:{definer}", says)]


def _hook_answerers(answers: list[tuple[str, Any]]) -> list[str]:
    """The plugins that answered a hook (a step that agrees with them is not one)."""
    return [p for p, _ in answers if not p.startswith("step:")]


def _declared_step(pm: WarcorePluginManager, algorithm: str) -> tuple[StepSpec, str] | None:
    """The step ``algorithm``'s :class:`AlgorithmSpec` declares, and the plugin offering it."""
    offer = get_registry(pm).algorithms.get(algorithm)
    if offer is None or offer.spec.step is None:
        return None
    return offer.spec.step, offer.plugin


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
        vetoes.append((BUILTIN, f"the prefill fast path is switched off ({ENV_PREFILL})"))
    answers, failures = _ask(
        pm,
        "warcore_fast_path_veto",
        {"forward_mode": mode, "context": ctx},
        lambda v: isinstance(v, str) and bool(v.strip()),
        "a non-empty reason string",
    )
    vetoes.extend(answers)
    vetoes.extend((f"failed:{f.plugin}", f.error) for f in failures)
    _log_failures(pm, failures, f"mode {mode.name}", "counted as a veto (coarse fence)")
    return VetoResolution(mode, ctx, tuple(vetoes), tuple(failures))


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
    answers, failures = _ask(
        pm,
        "warcore_step_event_owner",
        {"algorithm": algorithm, "facts": facts},
        lambda v: v in EVENT_OWNERS,
        " or ".join(repr(o) for o in EVENT_OWNERS),
    )
    stepped = _declared_step(pm, algorithm)  # the step's last reader's runner (issue 14)
    if stepped is not None:
        answers += _step_answer(answers, stepped[1], stepped[0].owner)
    values = {v for _, v in answers}
    owner: str | None
    if failures:
        owner, source = None, f"default:failed:{failures[0].plugin}"
        _log_failures(pm, failures, f"algorithm {algorithm!r}", "no event owner (coarse fence)")
    elif len(values) > 1:
        owner, source = None, "default:conflict"
        who = ", ".join(f"{p}={v}" for p, v in answers)
        pm.log_once(
            ("owner-conflict", algorithm, facts),
            logging.WARNING,
            f"plugins disagree on the event owner of {algorithm!r}: {who}; no owner (coarse)",
        )
    elif values:
        owner, source = values.pop(), _source_of_answers(_hook_answerers(answers))
    else:
        if stepped is None:
            owner, source = "target", "default:target"
        else:
            owner, source = stepped[0].owner, f"step:{stepped[1]}"
    return OwnerResolution(algorithm, facts, owner, source, tuple(answers), tuple(failures))


def _backend_identity(
    pm: WarcorePluginManager,
    backend: str | AttentionBackend,
    mode: ForwardMode,
    ctx: BoundaryContext,
) -> tuple[str, tuple[Any, ...], PluginFailure | None, str]:
    """The backend's name, the children whose shared reads run in ``mode``, the failure of a
    wrapper's ``children_for`` (a raise, or a child that is neither a backend name nor a
    backend), and who answers for that code: the plugin offering the spec for a name,
    ``backend:<name>`` for a built backend's own method."""
    if isinstance(backend, str):
        name = backend
        offer = get_registry(pm).backends.get(backend)
        compose = offer.spec.children_for if offer is not None else None
        if offer is None or compose is None:
            return name, (), None, f"backend:{name}"
        owner = offer.plugin
        ask: Callable[[], Any] = lambda: compose(mode, ctx)  # noqa: E731
    else:
        found = getattr(backend, "name", None)
        if not isinstance(found, str):
            raise TypeError(f"backend {backend!r} has no string 'name'")
        name, owner = found, f"backend:{found}"
        children_for = getattr(backend, "children_for", None)
        legacy = getattr(backend, "children", None)
        if callable(children_for):
            ask = lambda: children_for(mode, ctx)  # noqa: E731
        elif callable(legacy):
            ask = legacy
        else:
            return name, (), None, owner
    try:
        answer = pm.call_as(owner, "children_for", ask)
        if isinstance(answer, str):
            raise TypeError(f"returned the string {answer!r}, not a sequence of backend names")
        children = tuple(answer)
    except Exception as exc:
        return name, (), PluginFailure(owner, "children_for", f"{type(exc).__name__}: {exc}"), owner
    for child in children:
        if not isinstance(child, str) and not isinstance(getattr(child, "name", None), str):
            error = (
                f"named {child!r} ({type(child).__name__}) as a child of {name!r}: not a "
                "backend name or a backend"
            )
            return name, (), PluginFailure(owner, "children_for", error), owner
    return name, children, None, owner


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
