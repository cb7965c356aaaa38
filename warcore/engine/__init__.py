"""The reference overlap engine: tiny model, scheduler, overlap loop, and the observer hook
(:mod:`~warcore.engine.observe`) that audit tools such as the Perfetto trace export
(:mod:`~warcore.audit.trace_export`) implement.

The names below are imported on first use (they need torch: ``pip install 'warcore[engine]'``);
:mod:`~warcore.engine.steps` and :mod:`~warcore.engine.builtin_plugin` (the core's own plugin)
import only the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore._lazy import lazy_exports

if TYPE_CHECKING:
    from warcore.engine.config import FENCES, LOOPS, EngineConfig
    from warcore.engine.drafter import AlgorithmFactoryError, DrafterError
    from warcore.engine.engine import Engine, EngineBusy, EngineFailed
    from warcore.engine.model import ModelConfig, TinyLlama
    from warcore.engine.observe import EngineObserver
    from warcore.engine.report import RunReport, compare_with_serial
    from warcore.engine.requests import MAX_TRACE_REQUESTS, Request, synthetic_trace
    from warcore.engine.scheduler import Scheduler, SchedulerConfig

_EXPORTS = {
    "AlgorithmFactoryError": "warcore.engine.drafter",
    "DrafterError": "warcore.engine.drafter",
    "FENCES": "warcore.engine.config",
    "LOOPS": "warcore.engine.config",
    "EngineConfig": "warcore.engine.config",
    "Engine": "warcore.engine.engine",
    "EngineBusy": "warcore.engine.engine",
    "EngineFailed": "warcore.engine.engine",
    "RunReport": "warcore.engine.report",
    "compare_with_serial": "warcore.engine.report",
    "ModelConfig": "warcore.engine.model",
    "TinyLlama": "warcore.engine.model",
    "EngineObserver": "warcore.engine.observe",
    "MAX_TRACE_REQUESTS": "warcore.engine.requests",
    "Request": "warcore.engine.requests",
    "synthetic_trace": "warcore.engine.requests",
    "Scheduler": "warcore.engine.scheduler",
    "SchedulerConfig": "warcore.engine.scheduler",
}

__all__ = [
    "FENCES",
    "MAX_TRACE_REQUESTS",
    "LOOPS",
    "AlgorithmFactoryError",
    "DrafterError",
    "Engine",
    "EngineBusy",
    "EngineConfig",
    "EngineFailed",
    "EngineObserver",
    "ModelConfig",
    "Request",
    "RunReport",
    "Scheduler",
    "SchedulerConfig",
    "TinyLlama",
    "compare_with_serial",
    "synthetic_trace",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
