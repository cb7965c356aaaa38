"""warcore: exact write-after-read read-done fences for overlap schedulers.

The public vocabulary lives here; everything heavy (torch, devices, the engine) is imported by
the submodules that need it, so ``import warcore`` is cheap and does no device work.
"""

from warcore.core import (
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
    BoundaryResolution,
    Decision,
    Declared,
    DecisionCache,
    Execution,
    ForwardMode,
    OwnerResolution,
    PublishResolution,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    StepFacts,
    VetoResolution,
    get_decision_cache,
    get_plugin_manager,
    hookimpl,
    hookspec,
    latest,
    reset_plugin_manager,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)

__version__ = "0.1.0"

__all__ = [
    "AlgorithmSpec",
    "BackendSpec",
    "BoundaryContext",
    "BoundaryResolution",
    "Decision",
    "DecisionCache",
    "Declared",
    "Execution",
    "ForwardMode",
    "OwnerResolution",
    "PublishResolution",
    "RecordPoint",
    "RunnerKind",
    "SharedReadBoundary",
    "StepFacts",
    "VetoResolution",
    "get_decision_cache",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "latest",
    "reset_plugin_manager",
    "resolve_fast_path_veto",
    "resolve_shared_read_boundary",
    "resolve_step_event_owner",
    "resolve_war_publish_phase",
]
