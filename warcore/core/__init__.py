"""The core: the vocabulary, the hooks, the plugin manager and its loader, the registry, the
resolution of plugin answers, the runners' pure decision and the decision cache.

pluggy and packaging only, never torch (a test and the import contract keep it so). Everything
here is the core's public surface: code outside the core imports these names, never a private
module. :mod:`warcore` re-exports the part a plugin author needs.
"""

from ._boundary import Declared, Execution, RecordPoint, SharedReadBoundary, latest
from ._cache import Decision, DecisionCache, DecisionKey, decide, get_decision_cache
from ._config import ENV_DISABLE_PLUGINS, ENV_PLUGINS, LoaderConfig
from ._decisions import (
    RunnerKind,
    host_release_point,
    last_shared_read_runner,
    record_point,
    runner_kind_for,
    staged_prefill_point,
)
from ._diagnostics import PluginInfo, PluginValidationError
from ._flags import check_flags, parse_decimal
from ._hookspecs import hookimpl, hookspec
from ._manager import (
    PluginLoadError,
    PluginReentryError,
    WarcorePluginManager,
    get_plugin_manager,
    reset_plugin_manager,
)
from ._modes import CONTRACT_MODES, ForwardMode
from ._registry import DuplicateNameError, UnknownNameError, get_registry
from ._resolve import (
    BoundaryResolution,
    OwnerResolution,
    PublishResolution,
    VetoResolution,
    resolve_fast_path_veto,
    resolve_shared_read_boundary,
    resolve_step_event_owner,
    resolve_war_publish_phase,
)
from ._select import BUILTIN_PLUGIN_NAME
from ._specs import (
    CORE_FLAGS,
    INT_FLAG_BOUNDS,
    NCCL_ALLGATHER_IN_OVERLAP,
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
    FlagSpec,
    FlagValue,
    HostReads,
    StepFacts,
    parse_host_reads,
    validate_name,
)
from ._steps import NUM_DRAFT, PUBLISHING_MODES, Phase, StepSpec

__all__ = [
    # the vocabulary
    "CONTRACT_MODES",
    "CORE_FLAGS",
    "INT_FLAG_BOUNDS",
    "NCCL_ALLGATHER_IN_OVERLAP",
    "NUM_DRAFT",
    "PUBLISHING_MODES",
    "AlgorithmSpec",
    "BackendSpec",
    "BoundaryContext",
    "Declared",
    "Execution",
    "FlagSpec",
    "FlagValue",
    "ForwardMode",
    "HostReads",
    "Phase",
    "RecordPoint",
    "SharedReadBoundary",
    "StepFacts",
    "StepSpec",
    "check_flags",
    "latest",
    "parse_decimal",
    "parse_host_reads",
    "validate_name",
    # the hooks, the manager and the registry
    "BUILTIN_PLUGIN_NAME",
    "ENV_DISABLE_PLUGINS",
    "ENV_PLUGINS",
    "DuplicateNameError",
    "LoaderConfig",
    "PluginInfo",
    "PluginLoadError",
    "PluginReentryError",
    "PluginValidationError",
    "UnknownNameError",
    "WarcorePluginManager",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "hookspec",
    "reset_plugin_manager",
    # resolution, the runners' decision and its cache
    "BoundaryResolution",
    "Decision",
    "DecisionCache",
    "DecisionKey",
    "OwnerResolution",
    "PublishResolution",
    "RunnerKind",
    "VetoResolution",
    "decide",
    "get_decision_cache",
    "host_release_point",
    "last_shared_read_runner",
    "record_point",
    "staged_prefill_point",
    "resolve_fast_path_veto",
    "resolve_shared_read_boundary",
    "resolve_step_event_owner",
    "resolve_war_publish_phase",
    "runner_kind_for",
]
