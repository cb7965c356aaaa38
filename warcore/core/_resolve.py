"""Resolving plugin answers into one boundary / publish phase, with provenance.

Each hookimpl is asked on its own: pluggy's ``firstresult`` would let registration order decide
and would let one raising plugin abort the call for everybody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._boundary import SharedReadBoundary, latest
from ._manager import WarcorePluginManager, get_plugin_manager
from ._modes import ForwardMode
from ._registry import get_registry
from ._specs import BoundaryContext

if TYPE_CHECKING:
    from warcore.attention import AttentionBackend

__all__ = [
    "BoundaryResolution",
    "PluginFailure",
    "PublishResolution",
    "resolve_shared_read_boundary",
    "resolve_war_publish_phase",
]

_CONTRACT_MODES = frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY})


@dataclass(frozen=True)
class PluginFailure:
    """A hookimpl that raised or answered with the wrong type."""

    plugin: str
    hook: str
    error: str


@dataclass(frozen=True)
class BoundaryResolution:
    """The resolved boundary of (backend, mode, context) and where it came from.

    ``source`` is one of ``plugin:<name>``, ``default:contract``, ``default:no-answer``,
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
        return self.source == "default:conflict" or any(c.conflict for c in self.children)


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
) -> tuple[list[tuple[str, Any]], list[PluginFailure]]:
    answers: list[tuple[str, Any]] = []
    failures: list[PluginFailure] = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        try:
            value = impl.function(**{name: kwargs[name] for name in impl.argnames})
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


def _source_of_answers(names: list[str]) -> str:
    return "plugin:" + "+".join(sorted(set(names)))


def resolve_shared_read_boundary(
    backend: str | AttentionBackend,
    forward_mode: ForwardMode | str,
    context: BoundaryContext | None = None,
    *,
    pm: WarcorePluginManager | None = None,
) -> BoundaryResolution:
    """Resolve where ``backend``'s last shared read ends in ``forward_mode``.

    ``backend`` is a backend name or instance; a wrapper (an instance whose ``children()`` is
    not empty) resolves to the latest of its children. Not for the hot path: runners resolve
    once through :class:`~warcore.core.DecisionCache`.
    """
    pm = pm if pm is not None else get_plugin_manager()
    mode = ForwardMode.parse(forward_mode)
    ctx = context if context is not None else BoundaryContext()
    name, children = _backend_identity(backend)
    if children:
        resolved = tuple(resolve_shared_read_boundary(c, mode, ctx, pm=pm) for c in children)
        boundary = latest(r.boundary for r in resolved)
        decider = next(r for r in resolved if r.boundary is boundary)
        return BoundaryResolution(name, mode, ctx, boundary, decider.source, children=resolved)
    if pm.config.force_coarse:
        return BoundaryResolution(name, mode, ctx, SharedReadBoundary.UNKNOWN, "forced-coarse")

    answers, failures = _ask(
        pm,
        "warcore_shared_read_boundary",
        {"backend": name, "forward_mode": mode, "context": ctx},
        lambda v: isinstance(v, SharedReadBoundary),
        "SharedReadBoundary",
    )
    values = [v for _, v in answers]
    where = f"backend {name!r}, mode {mode.name}, algorithm {ctx.algorithm!r}"
    if failures:
        boundary, source = SharedReadBoundary.UNKNOWN, f"default:failed:{failures[0].plugin}"
        for f in failures:
            pm.log_once(
                ("failed", f.plugin, name, mode, ctx),
                logging.WARNING,
                f"plugin {f.plugin!r} hook {f.hook!r} failed for {where}: {f.error}; "
                "treated as UNKNOWN (coarse fence)",
            )
    elif len(set(values)) > 1:
        boundary, source = latest(values), "default:conflict"
        who = ", ".join(f"{p}={v.name}" for p, v in answers)
        pm.log_once(
            ("conflict", name, mode, ctx),
            logging.WARNING,
            f"plugins disagree on {where}: {who}; using the latest, {boundary.name}",
        )
    elif values:
        boundary, source = values[0], _source_of_answers([p for p, _ in answers])
    elif mode in _CONTRACT_MODES and _follows_contract(pm, backend):
        boundary, source = SharedReadBoundary.IN_REPLAY, "default:contract"
    else:
        boundary, source = SharedReadBoundary.UNKNOWN, "default:no-answer"
        pm.log_once(
            ("no-answer", name, mode, ctx),
            logging.DEBUG,
            f"no plugin declares {where}: UNKNOWN (coarse fence)",
        )
    return BoundaryResolution(name, mode, ctx, boundary, source, tuple(answers), tuple(failures))


def resolve_war_publish_phase(
    algorithm: str,
    forward_mode: ForwardMode | str,
    *,
    pm: WarcorePluginManager | None = None,
) -> PublishResolution:
    """Resolve whether ``forward_mode`` is the step's last shared reader for ``algorithm``.

    Anything doubtful (failures, disagreement, no answer) resolves to ``False``: not
    publishing keeps the coarse fence, which is always safe.
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
    values = {v for _, v in answers}
    where = f"algorithm {algorithm!r}, mode {mode.name}"
    if failures:
        publishes, source = False, f"default:failed:{failures[0].plugin}"
        for f in failures:
            pm.log_once(
                ("failed", f.plugin, algorithm, mode),
                logging.WARNING,
                f"plugin {f.plugin!r} hook {f.hook!r} failed for {where}: {f.error}; "
                "not publishing (coarse fence)",
            )
    elif len(values) > 1:
        publishes, source = False, "default:conflict"
        who = ", ".join(f"{p}={v}" for p, v in answers)
        pm.log_once(
            ("conflict", algorithm, mode),
            logging.WARNING,
            f"plugins disagree on {where}: {who}; not publishing (coarse fence)",
        )
    elif values:
        publishes, source = values.pop(), _source_of_answers([p for p, _ in answers])
    else:
        publishes, source = False, "default:no-answer"
    return PublishResolution(algorithm, mode, publishes, source, tuple(answers), tuple(failures))


def _backend_identity(backend: str | AttentionBackend) -> tuple[str, tuple[Any, ...]]:
    if isinstance(backend, str):
        return backend, ()
    name = getattr(backend, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"backend {backend!r} has no string 'name'")
    children = getattr(backend, "children", None)
    return name, tuple(children()) if callable(children) else ()


def _follows_contract(pm: WarcorePluginManager, backend: str | AttentionBackend) -> bool:
    """The metadata contract covers AttentionBackend instances and registered backend names."""
    from warcore.attention import AttentionBackend

    if isinstance(backend, AttentionBackend):
        return True
    return isinstance(backend, str) and backend in get_registry(pm).backends
