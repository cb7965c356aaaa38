"""The reference overlap engine: tiny model, scheduler, overlap loop, and the observer hook
(:mod:`~warcore.engine.observe`) that audit tools such as the Perfetto trace export
(:mod:`~warcore.audit.trace_export`) implement."""

from warcore.engine.config import FENCES, LOOPS, EngineConfig
from warcore.engine.drafter import DrafterError
from warcore.engine.engine import Engine, EngineFailed
from warcore.engine.model import ModelConfig, TinyLlama
from warcore.engine.observe import EngineObserver
from warcore.engine.report import RunReport, compare_with_serial
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
