"""What ``warcore matrix`` and ``warcore check`` compute: plain data, no printing."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from warcore.attention.composite import check_engine_flags
from warcore.audit.steps import StepConflict, step_audit
from warcore.core import (
    CONTRACT_MODES,
    ENV_PLUGINS,
    AlgorithmSpec,
    BoundaryContext,
    BoundaryResolution,
    DecisionCache,
    Execution,
    FlagValue,
    ForwardMode,
    OwnerResolution,
    PluginInfo,
    PublishResolution,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    StepFacts,
    VetoResolution,
    WarcorePluginManager,
    get_decision_cache,
    get_registry,
    host_release_point,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
    runner_kind_for,
)
from warcore.engine.steps import prefill_staging

__all__ = [
    "ENGINE_NEUTRAL_ALGORITHMS",
    "RUNNER_OF_MODE",
    "MatrixRow",
    "build_matrix",
    "find_notes",
    "find_problems",
    "staging_lines",
    "model_differences",
    "undeclared_contract_modes",
]

_PUBLISHING_MODES = (
    ForwardMode.DECODE,
    ForwardMode.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND_V2,
    ForwardMode.EXTEND,
)
RUNNER_OF_MODE: Mapping[ForwardMode, RunnerKind] = {
    mode: runner_kind_for(mode) for mode in _PUBLISHING_MODES
}
"""The runner that owns (and may publish for) each mode; other modes never publish."""

NO_RUNNER = "no-runner"
"""Provenance of the record point of a mode that no runner publishes for."""

ENGINE_NEUTRAL_ALGORITHMS = frozenset({"none"})
"""Algorithms every engine runs (no speculation): the matrix pairs them with every backend.
Other cells pair a backend only with algorithms of its own engine (``BackendSpec.engine`` ==
``AlgorithmSpec.engine``): an sglang backend never runs under a reference-engine algorithm."""


@dataclass(frozen=True)
class MatrixRow:
    """One cell: a backend in a mode under an algorithm. ``record_point`` is for a captured
    graph with a node (prefill: its eager run), ``eager_point`` for an uncaptured run; a
    ``PRE_REPLAY`` prefill is refined per batch by the backend (``per_batch``); ``owner`` is
    the runner whose event the step's barrier takes, for the matrix's :class:`StepFacts`."""

    backend: str
    mode: ForwardMode
    algorithm: str
    runner: RunnerKind | None
    declared: BoundaryResolution
    publish: PublishResolution
    record_point: RecordPoint
    source: str
    eager_point: RecordPoint = RecordPoint.NONE
    eager_source: str = NO_RUNNER
    eager_boundary: BoundaryResolution | None = None
    veto: VetoResolution | None = None
    per_batch: bool = False
    owner: OwnerResolution | None = None
    host_reads: SharedReadBoundary | None = None
    """Until when the backend's kernels read the staged host buffers (its spec's
    ``host_reads``; ``None``: only the engine's own copies in ``load_batch`` read them)."""
    staging: str = "-"
    """The algorithm's staging hook's answer for its prefill
    (:func:`warcore.engine.steps.prefill_staging`: ``stages``, ``none: prefill coarse``,
    ``not needed``)."""
    stage_point: RecordPoint = RecordPoint.NONE
    """Where this prefill cell records for a batch the stager staged (``NONE``: staging
    changes nothing here)."""

    @property
    def host_release(self) -> RecordPoint:
        """Where the forward's host staging slot is released: its read-done record point
        when that covers the host reads, else (``NONE``) the forward's done event."""
        return host_release_point(self.record_point, self.host_reads)

    def as_dict(self) -> dict[str, Any]:
        vetoes = [] if self.veto is None else self.veto.vetoes
        return {
            "backend": self.backend,
            "mode": self.mode.name,
            "algorithm": self.algorithm,
            "boundary": self.declared.boundary.name,
            "boundary_source": self.declared.source,
            "publish_phase": self.publish.publishes,
            "publish_source": self.publish.source,
            "runner": None if self.runner is None else self.runner.value,
            "record_point": self.record_point.value,
            "source": self.source,
            "eager_boundary": None
            if self.eager_boundary is None
            else self.eager_boundary.boundary.name,
            "eager_record_point": self.eager_point.value,
            "eager_source": self.eager_source,
            "vetoes": [{"by": who, "reason": why} for who, why in vetoes],
            "per_batch": self.per_batch,
            "event_owner": None if self.owner is None else self.owner.owner,
            "event_owner_source": None if self.owner is None else self.owner.source,
            "host_reads": None if self.host_reads is None else self.host_reads.name,
            "host_release": self.host_release.value if self.runner is not None else None,
            "prefill_staging": self.staging,
            "staged_record_point": self.stage_point.value,
        }


def build_matrix(
    pm: WarcorePluginManager,
    flags: Mapping[str, FlagValue] | None = None,
    facts: StepFacts | None = None,
    *,
    backends: Collection[str] | None = None,
    modes: Collection[ForwardMode] | None = None,
    algorithms: Collection[str] | None = None,
) -> list[MatrixRow]:
    """Every registered backend × every mode × every registered algorithm of the backend's
    engine (and :data:`ENGINE_NEUTRAL_ALGORITHMS`), sorted by name; ``facts`` are the step
    facts the event owner is resolved for (default: a rank with a draft model, nothing
    staged). ``backends``, ``modes`` and ``algorithms`` keep only the cells whose backend,
    mode and algorithm are among them (``None``: every one); the other cells are not
    resolved. ``flags`` are checked as ``--flag`` checks them (:class:`ValueError` naming a
    flag that is undeclared, of the wrong kind, or names no usable child backend)."""
    checked = check_engine_flags(flags or {}, pm)  # a typo would read as the default
    registry = get_registry(pm)
    cache = get_decision_cache(pm)
    facts = facts if facts is not None else StepFacts()
    return [
        _row(pm, cache, backend, mode, BoundaryContext(algorithm, checked), facts)
        for backend in sorted(registry.backends)
        if backends is None or backend in backends
        for mode in ForwardMode
        if modes is None or mode in modes
        for algorithm in sorted(registry.algorithms)
        if algorithms is None or algorithm in algorithms
        if _same_engine(registry.backends[backend].spec.engine, registry.algorithms[algorithm].spec)
    ]


def _same_engine(engine: str, algorithm: AlgorithmSpec) -> bool:
    return algorithm.name in ENGINE_NEUTRAL_ALGORITHMS or algorithm.engine == engine


def _row(
    pm: WarcorePluginManager,
    cache: DecisionCache,
    backend: str,
    mode: ForwardMode,
    context: BoundaryContext,
    facts: StepFacts,
) -> MatrixRow:
    runner = RUNNER_OF_MODE.get(mode)
    owner = cache.event_owner(context.algorithm, facts)
    # The spec's and, where its factory is the backend class, the class's (merged by the spec).
    host_reads = get_registry(pm).backend(backend).host_read_until(mode)
    staging = prefill_staging(get_registry(pm).algorithm(context.algorithm))
    if runner is None:
        # Still resolve the answers: the declaration is worth showing, and `check` must see a
        # plugin that fails or conflicts in these modes too.
        declared = resolve_shared_read_boundary(backend, mode, context, pm=pm)
        publish = resolve_war_publish_phase(context.algorithm, mode, pm=pm)
        veto = resolve_fast_path_veto(mode, context, pm=pm)
        return MatrixRow(
            backend, mode, context.algorithm, None, declared, publish, RecordPoint.NONE,
            NO_RUNNER, veto=veto, owner=owner, host_reads=host_reads, staging=staging,
        )  # fmt: skip
    # The same cache the runners use, so the matrix shows exactly what they would do.
    decision = cache[(runner, backend, mode, context, Execution.GRAPH_PLANTED)]
    eager = cache[(runner, backend, mode, context, Execution.EAGER)]
    return MatrixRow(
        backend,
        mode,
        context.algorithm,
        runner,
        decision.declared,
        decision.publish,
        decision.record_point,
        decision.source,
        eager.record_point,
        eager.source,
        eager.declared,
        decision.veto,
        decision.refines_per_batch,
        owner,
        host_reads,
        staging,
        eager.stage_point,
    )


def find_problems(pm: WarcorePluginManager) -> list[str]:
    """One line per problem: failed plugins, unknown or ambiguous allowlist names, plugins that
    register no hook, registry and matrix."""
    rows = build_matrix(pm)  # first: a hook may register another plugin at run time
    problems = [_failed_plugin(info) for info in pm.failed_plugins]
    problems += [
        f"{ENV_PLUGINS} names {name!r}, but no installed warcore plugin has that entry-point "
        "or distribution name"
        for name in pm.unknown_allowlist_names
    ]
    problems += pm.allowlist_problems
    problems += [
        f"plugin {info.name!r}{_of_distribution(info)} registers no hook: it does nothing"
        for info in pm.plugin_infos
        if info.status == "active" and not info.hooks
    ]
    problems += get_registry(pm).problems
    steps = step_audit(pm)  # not runnable, or a step its hooks contradict (issue 14)
    problems += [line for _, line in steps]
    problems += _matrix_problems(rows, said={call for call, _ in steps if call is not None})
    return problems


def _of_distribution(info: PluginInfo) -> str:
    return f" (distribution {info.distribution!r})" if info.distribution else ""


def _failed_plugin(info: PluginInfo) -> str:
    return f"plugin {info.name!r}{_of_distribution(info)} failed: {info.error}"


def _matrix_problems(rows: list[MatrixRow], said: set[StepConflict]) -> list[str]:
    """Group identical problems so one broken plugin is one line, not one per matrix cell;
    leave out the conflicts with an algorithm's step that the step audit ``said``."""
    grouped: dict[str, dict[str, None]] = {}
    for row in rows:
        for message, where in _row_issues(row, said):
            grouped.setdefault(message, {})[where] = None
    return [_with_where(message, list(wheres)) for message, wheres in grouped.items()]


def _row_issues(row: MatrixRow, said: set[StepConflict]) -> Iterator[tuple[str, str]]:
    cell = f"backend {row.backend!r}, mode {row.mode.name}, algorithm {row.algorithm!r}"
    phase = f"algorithm {row.algorithm!r}, mode {row.mode.name}"
    if row.declared.own_conflict:
        answers = ", ".join(f"{p}={b.name}" for p, b in sorted(row.declared.answers))
        yield (
            f"conflict: plugins disagree on backend {row.backend!r} mode {row.mode.name}: "
            f"{answers}; using the latest, {row.declared.boundary.name}",
            f"algorithm {row.algorithm!r}",
        )
    if row.publish.conflict and (row.algorithm, row.mode) not in said:
        answers = ", ".join(f"{p}={v}" for p, v in sorted(row.publish.answers))
        yield (
            f"conflict: plugins disagree on the publish phase of {phase}: {answers}; "
            "not publishing",
            phase,
        )
    for resolution in _with_children(row.declared):  # a wrapper's children's too
        for failure in resolution.failures:
            yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", cell
        if resolution.source.startswith("stale:"):
            yield (
                f"stale declaration: plugin {resolution.source[len('stale:') :]!r} declares "
                f"backend {resolution.backend!r} for an implementation range that is not "
                "installed; not applied (coarse fence)",
                cell,
            )
    if row.veto is not None:
        for failure in row.veto.failures:
            yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", phase
    if row.owner is not None:
        who = f"the event owner of algorithm {row.algorithm!r}"
        for failure in row.owner.failures:
            yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", who
        if row.owner.source == "default:conflict" and (row.algorithm, None) not in said:
            answers = ", ".join(f"{p}={v}" for p, v in sorted(row.owner.answers))
            yield f"conflict: plugins disagree on {who}: {answers}; no owner (coarse)", who
    for failure in row.publish.failures:
        yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", phase


def _with_children(resolution: BoundaryResolution) -> Iterator[BoundaryResolution]:
    yield resolution
    for child in resolution.children:
        yield from _with_children(child)


def _with_where(message: str, wheres: list[str]) -> str:
    more = f" and {len(wheres) - 1} more" if len(wheres) > 1 else ""
    return f"{message} [{wheres[0]}{more}]"


# -- a backend beside the backend it models (BackendSpec.models) ---------------------------


@dataclass(frozen=True)
class ModelDifference:
    """One cell where a backend and the backend it ``models`` declare differently."""

    backend: str
    modelled: str
    mode: ForwardMode
    algorithm: str
    modelled_algorithm: str
    ours: BoundaryResolution
    theirs: BoundaryResolution

    def pair(self) -> str:
        if self.algorithm == self.modelled_algorithm:
            return repr(self.algorithm)
        return f"{self.algorithm!r}/{self.modelled_algorithm!r}"


def model_differences(
    pm: WarcorePluginManager, flags: Mapping[str, FlagValue] | None = None
) -> list[ModelDifference]:
    """Every (mode, algorithm pair) where a backend whose spec ``models`` another registered
    backend declares a different boundary than that backend (captured graph; eager prefill).

    Algorithms are paired by name (``none`` with ``none``) and by ``AlgorithmSpec.models``
    (``eagle`` with ``sglang_eagle``), each side only where its engine runs it. ``flags`` are
    checked as in :func:`build_matrix`."""
    checked = check_engine_flags(flags or {}, pm)
    registry = get_registry(pm)
    out: list[ModelDifference] = []
    for name, offer in sorted(registry.backends.items()):
        modelled = offer.spec.models
        if modelled is None or modelled not in registry.backends:
            continue
        theirs_spec = registry.backends[modelled].spec
        pairs = []
        for alg, alg_offer in sorted(registry.algorithms.items()):
            if not _same_engine(offer.spec.engine, alg_offer.spec):
                continue
            partner = alg if alg in ENGINE_NEUTRAL_ALGORITHMS else alg_offer.spec.models
            partner_offer = registry.algorithms.get(partner) if partner else None
            if partner_offer is None or not _same_engine(theirs_spec.engine, partner_offer.spec):
                continue
            pairs.append((alg, partner_offer.spec.name))
        for mode in ForwardMode:
            for alg, partner in pairs:
                ours = resolve_shared_read_boundary(
                    name, mode, BoundaryContext(alg, checked), pm=pm
                )
                theirs = resolve_shared_read_boundary(
                    modelled, mode, BoundaryContext(partner, checked), pm=pm
                )
                if ours.boundary is not theirs.boundary:
                    out.append(ModelDifference(name, modelled, mode, alg, partner, ours, theirs))
    return out


def find_notes(pm: WarcorePluginManager) -> list[str]:
    """``warcore check``'s informational lines (they never fail it): where a backend declares
    differently from the backend it models (``BackendSpec.models``), one line per mode and
    pair of answers, naming the algorithm pairs; then each backend that runs a contract mode on
    the coarse fence only because nothing declares it (:func:`undeclared_contract_modes`)."""
    return _model_notes(pm) + _contract_notes(pm)


_STAGING_MEANS = {
    "stages": "its prefill publishes early for each batch its prefill_shared_read_stager staged",
    "none: prefill coarse": "its prefill reads shared buffers later and it offers no "
    "prefill_shared_read_stager: its prefill keeps the coarse fence",
    "not needed": "its prefill is its own last shared reader",
}


def staging_lines(pm: WarcorePluginManager) -> list[str]:
    """``warcore check``'s ``staging:`` lines: per algorithm, its staging hook's answer
    (:func:`warcore.engine.steps.prefill_staging`) and what it means. Informational."""
    lines = []
    for name, offer in sorted(get_registry(pm).algorithms.items()):
        answer = prefill_staging(offer.spec)
        means = _STAGING_MEANS.get(answer, "no step the reference engine knows")
        lines.append(f"staging: algorithm {name!r} (plugin {offer.plugin!r}): {answer} ({means})")
    return lines


def undeclared_contract_modes(pm: WarcorePluginManager) -> dict[str, dict[ForwardMode, list[str]]]:
    """Backend -> contract mode -> the algorithms under which nobody declares the backend's
    captured graph there, and its spec does not declare that it follows the metadata contract
    (``default:no-answer``: ``UNKNOWN``, the coarse fence). Only the reference engine's leaf
    backends: a wrapper reads what its children read, and another engine's backends answer
    through that engine's plugin."""
    registry = get_registry(pm)
    found: dict[str, dict[ForwardMode, list[str]]] = {}
    for row in build_matrix(pm):
        spec = registry.backends[row.backend].spec
        if spec.engine != "warcore" or spec.children_for is not None:
            continue
        if row.mode in CONTRACT_MODES and row.declared.source == "default:no-answer":
            found.setdefault(row.backend, {}).setdefault(row.mode, []).append(row.algorithm)
    return found


def _contract_notes(pm: WarcorePluginManager) -> list[str]:
    registry = get_registry(pm)
    notes = []
    for backend, modes in sorted(undeclared_contract_modes(pm).items()):
        order = sorted(modes, key=lambda m: m.name)
        everywhere = set(order) == set(CONTRACT_MODES)
        line = (
            "follows_contract=warcore.CONTRACT_MODES"
            if everywhere
            else "follows_contract={" + ", ".join(f"ForwardMode.{m.name}" for m in order) + "}"
        )
        where = " and ".join(m.name for m in order)
        engine = registry.backends[backend].spec.engine
        paired = {a for a, o in registry.algorithms.items() if _same_engine(engine, o.spec)}
        algorithms = sorted({a for m in order for a in modes[m]})
        partial = set(algorithms) != paired
        under = f" (algorithms {', '.join(map(repr, algorithms))})" if partial else ""
        notes.append(
            f"note: backend {backend!r} (plugin {registry.backends[backend].plugin!r}) runs "
            f"{where}{under} on the coarse fence only because nothing declares them; if an "
            "audit shows its shared reads end in its in-graph init there, opt in with one line "
            f"in its BackendSpec: {line} (then: warcore sanitize --backend {backend})"
        )
    return notes


def _model_notes(pm: WarcorePluginManager) -> list[str]:
    grouped: dict[tuple[str, ...], list[str]] = {}
    for d in model_differences(pm):
        key = (
            d.backend,
            d.modelled,
            d.mode.name,
            d.ours.boundary.name,
            d.ours.source,
            d.theirs.boundary.name,
            d.theirs.source,
        )
        grouped.setdefault(key, []).append(d.pair())
    return [
        f"note: backend {backend!r} models {modelled!r} but declares {mode} differently: "
        f"{backend} {ours} ({our_source}), {modelled} {theirs} ({their_source}) "
        f"[algorithms {', '.join(pairs)}]"
        for (backend, modelled, mode, ours, our_source, theirs, their_source), pairs in (
            grouped.items()
        )
    ]
