"""The core: vocabulary, plugin loading, resolution and the runners' pure decisions."""

from ._boundary import Execution, RecordPoint, SharedReadBoundary, latest
from ._decisions import (
    decode_record_point,
    draft_extend_record_point,
    honour_boundary,
    prefill_record_point,
)
from ._hookspecs import WarcoreSpecs, hookimpl, hookspec
from ._manager import (
    BUILTIN_PLUGIN_NAME,
    ENTRY_POINT_GROUP,
    ENV_DISABLE_PLUGINS,
    ENV_FORCE_COARSE,
    ENV_PLUGINS,
    ENV_STRICT_PLUGINS,
    LoaderConfig,
    PluginInfo,
    PluginLoadError,
    PluginValidationError,
    WarcorePluginManager,
    get_plugin_manager,
    reset_plugin_manager,
)
from ._modes import ForwardMode
from ._registry import DuplicateNameError, Registry, UnknownNameError, get_registry
from ._resolve import (
    BoundaryResolution,
    PluginFailure,
    PublishResolution,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)
from ._specs import (
    KNOWN_FAMILIES,
    NCCL_ALLGATHER_IN_OVERLAP,
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
)
from ._table import (
    Decision,
    DecisionCache,
    DecisionKey,
    RunnerKind,
    decide,
    get_decision_cache,
    runner_kind_for,
)

__all__ = [
    "BUILTIN_PLUGIN_NAME",
    "ENTRY_POINT_GROUP",
    "ENV_DISABLE_PLUGINS",
    "ENV_FORCE_COARSE",
    "ENV_PLUGINS",
    "ENV_STRICT_PLUGINS",
    "KNOWN_FAMILIES",
    "NCCL_ALLGATHER_IN_OVERLAP",
    "AlgorithmSpec",
    "BackendSpec",
    "BoundaryContext",
    "BoundaryResolution",
    "Decision",
    "DecisionCache",
    "DecisionKey",
    "DuplicateNameError",
    "Execution",
    "ForwardMode",
    "LoaderConfig",
    "PluginFailure",
    "PluginInfo",
    "PluginLoadError",
    "PluginValidationError",
    "PublishResolution",
    "RecordPoint",
    "Registry",
    "RunnerKind",
    "SharedReadBoundary",
    "UnknownNameError",
    "WarcorePluginManager",
    "WarcoreSpecs",
    "decide",
    "decode_record_point",
    "draft_extend_record_point",
    "get_decision_cache",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "hookspec",
    "honour_boundary",
    "latest",
    "prefill_record_point",
    "reset_plugin_manager",
    "resolve_shared_read_boundary",
    "resolve_war_publish_phase",
    "runner_kind_for",
]
