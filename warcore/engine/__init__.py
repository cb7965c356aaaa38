"""The reference overlap engine: tiny model, KV pool, scheduler, overlap loop; its observers
(:mod:`~warcore.engine.observe`) and the Perfetto trace export
(:mod:`~warcore.engine.trace_export`), imported on use."""

from warcore.engine.drafter import DrafterError
from warcore.engine.engine import (
    FENCES,
    LOOPS,
    Engine,
    EngineConfig,
    EngineFailed,
    RunReport,
    compare_with_serial,
)
from warcore.engine.model import ModelConfig, TinyLlama
from warcore.engine.observe import EngineObserver
from warcore.engine.requests import MAX_TRACE_REQUESTS, Request, synthetic_trace
from warcore.engine.scheduler import Scheduler, SchedulerConfig

__all__ = [
    "FENCES",
    "MAX_TRACE_REQUESTS",
    "LOOPS",
    "DrafterError",
    "Engine",
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
