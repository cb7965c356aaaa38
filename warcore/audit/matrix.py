"""What ``warcore matrix`` and ``warcore check`` compute: plain data, no printing."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from warcore.core import (
    ENV_PLUGINS,
    BoundaryContext,
    BoundaryResolution,
    DecisionCache,
    Execution,
    ForwardMode,
    PluginInfo,
    PublishResolution,
    RecordPoint,
    RunnerKind,
    WarcorePluginManager,
    get_decision_cache,
    get_registry,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
    runner_kind_for,
)
from warcore.core._specs import FlagValue

__all__ = ["RUNNER_OF_MODE", "MatrixRow", "build_matrix", "find_problems"]

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


@dataclass(frozen=True)
class MatrixRow:
    """One cell: a backend in a mode under an algorithm, for a captured graph with a node."""

    backend: str
    mode: ForwardMode
    algorithm: str
    runner: RunnerKind | None
    declared: BoundaryResolution
    publish: PublishResolution
    record_point: RecordPoint
    source: str

    def as_dict(self) -> dict[str, Any]:
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
        }


def build_matrix(
    pm: WarcorePluginManager, flags: Mapping[str, FlagValue] | None = None
) -> list[MatrixRow]:
    """Every registered backend × every mode × every registered algorithm, sorted by name."""
    registry = get_registry(pm)
    cache = get_decision_cache(pm)
    return [
        _row(pm, cache, backend, mode, BoundaryContext(algorithm, flags or {}))
        for backend in sorted(registry.backends)
        for mode in ForwardMode
        for algorithm in sorted(registry.algorithms)
    ]


def _row(
    pm: WarcorePluginManager,
    cache: DecisionCache,
    backend: str,
    mode: ForwardMode,
    context: BoundaryContext,
) -> MatrixRow:
    runner = RUNNER_OF_MODE.get(mode)
    if runner is None:
        # Still resolve both answers: the declaration is worth showing, and `check` must see a
        # plugin that fails or conflicts in these modes too.
        declared = resolve_shared_read_boundary(backend, mode, context, pm=pm)
        publish = resolve_war_publish_phase(context.algorithm, mode, pm=pm)
        point, source = RecordPoint.NONE, NO_RUNNER
    else:
        # The same cache the runners use, so the matrix shows exactly what they would do.
        decision = cache[(runner, backend, mode, context, Execution.GRAPH_PLANTED)]
        declared, publish = decision.declared, decision.publish
        point, source = decision.record_point, decision.source
    return MatrixRow(backend, mode, context.algorithm, runner, declared, publish, point, source)


def find_problems(pm: WarcorePluginManager) -> list[str]:
    """One line per problem: failed plugins, unknown allowlist names, registry and matrix."""
    problems = [_failed_plugin(info) for info in pm.failed_plugins]
    problems += [
        f"{ENV_PLUGINS} names {name!r}, but no installed warcore plugin has that entry-point "
        "or distribution name"
        for name in pm.unknown_allowlist_names
    ]
    problems += get_registry(pm).problems
    problems += _matrix_problems(build_matrix(pm))
    return problems


def _failed_plugin(info: PluginInfo) -> str:
    dist = f" (distribution {info.distribution!r})" if info.distribution else ""
    return f"plugin {info.name!r}{dist} failed: {info.error}"


def _matrix_problems(rows: list[MatrixRow]) -> list[str]:
    """Group identical problems so one broken plugin is one line, not one per matrix cell."""
    grouped: dict[str, dict[str, None]] = {}
    for row in rows:
        for message, where in _row_issues(row):
            grouped.setdefault(message, {})[where] = None
    return [_with_where(message, list(wheres)) for message, wheres in grouped.items()]


def _row_issues(row: MatrixRow) -> Iterator[tuple[str, str]]:
    cell = f"backend {row.backend!r}, mode {row.mode.name}, algorithm {row.algorithm!r}"
    phase = f"algorithm {row.algorithm!r}, mode {row.mode.name}"
    if row.declared.conflict:
        answers = ", ".join(f"{p}={b.name}" for p, b in sorted(row.declared.answers))
        yield (
            f"conflict: plugins disagree on backend {row.backend!r} mode {row.mode.name}: "
            f"{answers}; using the latest, {row.declared.boundary.name}",
            f"algorithm {row.algorithm!r}",
        )
    if row.publish.conflict:
        answers = ", ".join(f"{p}={v}" for p, v in sorted(row.publish.answers))
        yield (
            f"conflict: plugins disagree on the publish phase of {phase}: {answers}; "
            "not publishing",
            phase,
        )
    for failure in row.declared.failures:
        yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", cell
    for failure in row.publish.failures:
        yield f"plugin {failure.plugin!r} hook {failure.hook!r} failed: {failure.error}", phase


def _with_where(message: str, wheres: list[str]) -> str:
    more = f" and {len(wheres) - 1} more" if len(wheres) > 1 else ""
    return f"{message} [{wheres[0]}{more}]"
