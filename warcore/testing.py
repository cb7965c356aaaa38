"""``warcore.testing``: a pytest plugin for authors of warcore plugins (opt-in).

Enable it in the ``conftest.py`` at the root of your tests, or with ``-p warcore.testing``::

    pytest_plugins = ["warcore.testing"]

It gives you:

* ``warcore_pm``, a fixture: a fresh :class:`~warcore.core.WarcorePluginManager` holding the
  core's built-ins and only the installed plugins your test names with the marker
  ``@pytest.mark.warcore_plugins("my_plugin", "dflash")`` (none without it). Nothing global is
  touched, so the test cannot see or disturb the process-wide manager.
* ``make_warcore_pm``, the same as a factory, for tests that need several managers or want to
  register plugin objects: ``make_warcore_pm(MyPlugin(), entry_points=["dflash"])``.
* ``register_for_test``, a fixture: ``register_for_test(plugin)`` registers ``plugin`` (into the
  process-wide manager, or ``pm=``) for this test only; it is unregistered afterwards.
* :func:`assert_declarations_sound`, the conformance check: it runs the WAR sanitizer over a
  backend's or an algorithm's declarations (every combination the reference engine can run)
  and fails with the sanitizer's report, and the read tracer's account of where the offending
  mode's last shared read is, when a read-done event is recorded before a shared read. It
  also runs the binding audit: a wait bound to an earlier forward's record fails the check; a
  wait bound to a later forward's record (a liveness hazard) is a :class:`BindingWarning`
  naming both forwards.
* :class:`DeclaredBackend`, a plugin object offering a backend class under declarations you
  choose: to check that your backend passes with its declarations, and that the sanitizer
  catches it when a declaration is made earlier than the code allows.
* :class:`DeclaredAlgorithm`, the same for an algorithm: a plugin object offering an algorithm
  under a :class:`~warcore.StepSpec` you choose (your step, or one whose last reader is
  declared too early, which the sanitizer must refuse).
* :func:`assert_matches_serial`, the losslessness check for an algorithm: the reference engine
  serves a trace with the overlap loop and the fine fence, and its tokens must equal plain
  serial greedy decoding of the same trace.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Literal

import pytest

from warcore.attention import AttentionBackend
from warcore.audit.sanitizer import DEFAULT_REQUESTS, SanitizeReport, combinations, sanitize
from warcore.core import (
    BUILTIN_PLUGIN_NAME,
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
    FlagValue,
    ForwardMode,
    LoaderConfig,
    SharedReadBoundary,
    StepFacts,
    StepSpec,
    WarcorePluginManager,
    get_plugin_manager,
    hookimpl,
)
from warcore.engine import builtin_plugin as core_builtins

__all__ = [
    "BindingWarning",
    "CoreAlgorithms",
    "DeclaredAlgorithm",
    "DeclaredBackend",
    "assert_matches_serial",
    "assert_declarations_sound",
    "make_plugin_manager",
    "make_warcore_pm",
    "register_for_test",
    "warcore_pm",
]

Builtins = Literal["all", "algorithms", "none"]


class BindingWarning(UserWarning):
    """A wait on a read-done event bound to a later forward's record than the one it meant
    (a liveness hazard, sglang #31072's shape); the message names both forwards."""


MARKER = "warcore_plugins"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*entry_points, builtins='all'): the installed warcore plugins the "
        "warcore_pm fixture loads (entry-point or distribution names); builtins='algorithms' "
        "keeps the core's algorithms but not its backends and declarations",
    )


# -- plugin objects --------------------------------------------------------------------------


class CoreAlgorithms:
    """The core's algorithms (``none``, ``eagle``) and their publish phases, without its
    backends and boundary declarations: lets a test re-offer ``torch_native`` under
    declarations of its own without two plugins offering one name."""

    @hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        return core_builtins.warcore_speculative_algorithms()

    @hookimpl
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        return core_builtins.warcore_is_war_publish_phase(algorithm, forward_mode)

    @hookimpl
    def warcore_step_event_owner(self, algorithm: str, facts: StepFacts) -> str | None:
        return core_builtins.warcore_step_event_owner(algorithm, facts)

    @hookimpl
    def warcore_fast_path_veto(
        self, forward_mode: ForwardMode, context: BoundaryContext
    ) -> str | None:
        return core_builtins.warcore_fast_path_veto(forward_mode, context)


class DeclaredBackend:
    """A plugin offering ``backend`` (an :class:`~warcore.attention.AttentionBackend` class)
    and declaring, for it, exactly ``boundaries`` (mode -> boundary, as members or their names;
    other modes abstain).

    ``name`` defaults to the class's ``name``; another name offers the same code under that
    name (a subclass that differs only in ``name``), so it can sit beside the original.
    ``eager`` declares the eager (uncaptured) decode, verify and draft-extend: by default the
    same as ``boundaries`` (a backend without a separate eager body); ``{}`` declares no eager
    path, so those eager forwards record after the whole forward. ``follows_contract`` goes to
    the spec (:attr:`~warcore.BackendSpec.follows_contract`): the modes in which the backend
    claims to follow the metadata contract; by default none (undeclared modes are ``UNKNOWN``).
    """

    def __init__(
        self,
        backend: type[AttentionBackend],
        boundaries: Mapping[ForwardMode, SharedReadBoundary] | Mapping[str, str],
        *,
        name: str | None = None,
        eager: Mapping[ForwardMode, SharedReadBoundary] | Mapping[str, str] | None = None,
        follows_contract: Collection[ForwardMode] = frozenset(),
    ) -> None:
        self.name = name or backend.name
        self.follows_contract = follows_contract
        if self.name != backend.name:
            backend = type(backend.__name__, (backend,), {"name": self.name})
        self.backend = backend
        self.boundaries = {
            ForwardMode.parse(mode): SharedReadBoundary.parse(boundary)
            for mode, boundary in boundaries.items()
        }
        self.eager = (
            dict(self.boundaries)
            if eager is None
            else {
                ForwardMode.parse(mode): SharedReadBoundary.parse(boundary)
                for mode, boundary in eager.items()
            }
        )

    def __repr__(self) -> str:
        declared = ", ".join(f"{m.name}={b.name}" for m, b in self.boundaries.items())
        return f"DeclaredBackend({self.name!r}: {declared})"

    @hookimpl
    def warcore_attention_backends(self) -> Iterable[BackendSpec]:
        return [
            BackendSpec(
                self.name,
                self.backend,
                f"{self.backend.__name__} under test",
                follows_contract=self.follows_contract,
            )
        ]

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, eager: bool
    ) -> SharedReadBoundary | None:
        if backend != self.name:
            return None
        table = self.eager if eager and forward_mode.is_captured_kind() else self.boundaries
        return table.get(forward_mode)


class DeclaredAlgorithm:
    """A plugin offering an algorithm under a step you choose (a :class:`~warcore.StepSpec`):
    to run and sanitize a step shape, and to check that the sanitizer refuses it when its last
    reader is declared earlier than the forwards allow.

    ``drafter`` is the ``AlgorithmSpec.drafter`` factory (``drafter(target_model, num_draft,
    device)``: a draft model for draft phases, a :class:`~warcore.engine.drafter.Drafter` for
    ``propose=True``); ``family`` defaults to ``name``. It answers no hook: the publish phase
    and the event owner come from the step (provenance ``step:<this plugin>``).
    """

    def __init__(
        self,
        name: str,
        step: StepSpec,
        *,
        drafter: Callable[..., Any] | None = None,
        family: str | None = None,
        description: str = "",
    ) -> None:
        self.spec = AlgorithmSpec(
            name, family or name, description or f"step {step.describe()}", drafter, step
        )
        self.__name__ = f"DeclaredAlgorithm-{name}"

    def __repr__(self) -> str:
        return f"DeclaredAlgorithm({self.spec.name!r}: {self.spec.step})"

    @hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        return [self.spec]


# -- managers --------------------------------------------------------------------------------


def make_plugin_manager(
    *plugins: object,
    entry_points: Iterable[str] = (),
    builtins: Builtins = "all",
) -> WarcorePluginManager:
    """A fresh manager: the core's built-ins (``"all"``, ``"algorithms"`` only, or
    ``"none"``), the installed entry points named (entry-point or distribution names; an
    unknown or failing one raises), then ``plugins`` (objects or modules) in order. Hooks a
    plugin misspells raise :class:`~warcore.core.PluginValidationError`, as in production."""
    if builtins not in ("all", "algorithms", "none"):
        raise ValueError(f"builtins must be 'all', 'algorithms' or 'none', got {builtins!r}")
    names = frozenset(entry_points)
    config = LoaderConfig(allowlist=names, strict=True)
    pm = WarcorePluginManager(config, builtins=builtins == "all")
    if builtins == "algorithms":
        pm.register(CoreAlgorithms(), name=f"{BUILTIN_PLUGIN_NAME}-algorithms")
    if names:
        pm.load_entry_points()
        if pm.unknown_allowlist_names:
            unknown = ", ".join(pm.unknown_allowlist_names)
            raise LookupError(f"no installed warcore plugin is called {unknown}")
    for plugin in plugins:
        pm.register(plugin, name=_plugin_name(pm, plugin))
    pm.check_pending()
    return pm


def _plugin_name(pm: WarcorePluginManager, plugin: object) -> str:
    """A readable, unique name, so provenance says ``plugin:DeclaredBackend-1``, not an id."""
    base = getattr(plugin, "__name__", None) or type(plugin).__name__
    name, n = base, 1
    while pm.get_plugin(name) is not None:
        n += 1
        name = f"{base}-{n}"
    return name


@pytest.fixture
def make_warcore_pm() -> Callable[..., WarcorePluginManager]:
    """Factory fixture: ``make_warcore_pm(*plugins, entry_points=(), builtins="all")``."""
    return make_plugin_manager


@pytest.fixture
def warcore_pm(request: pytest.FixtureRequest) -> WarcorePluginManager:
    """A fresh manager with the built-ins and the plugins ``@pytest.mark.warcore_plugins``
    names (the closest marker wins)."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return make_plugin_manager()
    return make_plugin_manager(
        entry_points=marker.args, builtins=marker.kwargs.get("builtins", "all")
    )


@pytest.fixture
def register_for_test() -> Iterator[Callable[..., Any]]:
    """``register_for_test(plugin, pm=None)`` registers ``plugin`` (into the process-wide
    manager by default) for this test; every plugin registered so is unregistered after it."""
    registered: list[tuple[WarcorePluginManager, object]] = []

    def register(plugin: object, pm: WarcorePluginManager | None = None) -> object:
        manager = pm if pm is not None else get_plugin_manager()
        manager.register(plugin, name=_plugin_name(manager, plugin))
        registered.append((manager, plugin))
        return plugin

    yield register
    for manager, plugin in reversed(registered):
        if manager.is_registered(plugin):
            manager.unregister(plugin)


# -- the conformance check -------------------------------------------------------------------


def assert_declarations_sound(
    backend: str | None = None,
    algorithm: str | None = None,
    *,
    pm: WarcorePluginManager | None = None,
    device: str = "sim",
    requests: int = DEFAULT_REQUESTS,
    flags: Mapping[str, FlagValue] | None = None,
    explain: bool = True,
    **options: Any,
) -> list[SanitizeReport]:
    """Run the WAR sanitizer over every combination with ``backend`` (every algorithm the
    reference engine runs) or ``algorithm`` (every backend), or the one combination of both.

    Raises ``AssertionError`` listing each violation (with the read tracer's account of the
    mode's shared reads when ``explain``), or an engine error. Returns the reports otherwise.
    ``options`` go to :func:`warcore.audit.sanitizer.sanitize` (``use_graphs``,
    ``plant_node``, ``num_draft``, ...).
    """
    if backend is None and algorithm is None:
        raise ValueError("name a backend, an algorithm, or both")
    pm = pm if pm is not None else get_plugin_manager()
    combos = combinations(
        pm,
        [backend] if backend is not None else [],
        [algorithm] if algorithm is not None else [],
        device,
    )
    reports = [
        sanitize(
            c.backend, c.algorithm, pm=pm, device=device, requests=requests, flags=flags, **options
        )
        for c in combos
        if c.skipped is None
    ]
    if not reports:
        why = "; ".join(f"{c.backend}/{c.algorithm}: {c.skipped}" for c in combos)
        raise AssertionError(f"nothing to sanitize here ({why or 'no combination'})")
    for r in reports:
        for finding in r.binding_warnings:
            label = f"{r.backend} / {r.algorithm}"
            warnings.warn(f"{label}: {finding.describe()}", BindingWarning, stacklevel=2)
    failed = [r for r in reports if not r.sound]
    if failed:
        parts = [r.format() for r in failed]
        if explain:
            parts += [_explain(r, pm, device, flags) for r in failed if r.violation is not None]
        raise AssertionError("WAR declarations are unsound:\n" + "\n".join(parts))
    return reports


def _explain(
    report: SanitizeReport,
    pm: WarcorePluginManager,
    device: str,
    flags: Mapping[str, FlagValue] | None,
) -> str:
    from warcore.audit.tracer import trace_reads, violation_note

    violation = report.violation
    assert violation is not None
    trace = trace_reads(report.backend, report.algorithm, pm=pm, device=device, flags=flags)
    return violation_note(trace, violation)


def assert_matches_serial(
    algorithm: str,
    backend: str = "torch_native",
    *,
    pm: WarcorePluginManager | None = None,
    device: str = "sim",
    requests: int = 24,
    seed: int = 0,
    prompts: str = "random",
    num_draft: int = 4,
) -> Any:
    """Serve a seeded trace with ``algorithm`` on ``backend`` (overlap loop, fine fence) and
    with plain serial greedy decoding (algorithm ``none``, serial loop); raise
    ``AssertionError`` naming the first request whose tokens differ. Returns the algorithm's
    :class:`~warcore.engine.RunReport` (its ``mean_accepted`` is the acceptance)."""
    from warcore.engine import Engine, EngineConfig, synthetic_trace

    pm = pm if pm is not None else get_plugin_manager()
    trace = synthetic_trace(requests, seed=seed, prompts=prompts)
    configs = {
        "run": EngineConfig(backend=backend, algorithm=algorithm, num_draft=num_draft),
        "oracle": EngineConfig(backend=backend, algorithm="none", loop="serial"),
    }
    reports = {}
    for label, config in configs.items():
        with Engine(config, device=device, pm=pm) as engine:
            reports[label] = engine.run(trace)
    run, oracle = reports["run"], reports["oracle"]
    for label, report in reports.items():
        if report.errors or report.stopped:
            why = report.stopped or report.errors
            raise AssertionError(f"{label} of {algorithm!r} failed: {why}")
    for rid, tokens in oracle.outputs.items():
        if run.outputs.get(rid) != tokens:
            raise AssertionError(
                f"algorithm {algorithm!r} on {backend!r}: request {rid} produced "
                f"{run.outputs.get(rid)}, plain serial greedy decoding {tokens}"
            )
    return run
