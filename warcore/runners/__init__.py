"""Runners: execute a forward and record its read-done event at the decided point."""

from warcore.runners._runner import ModelRunner, ReadDoneMailbox, StepOutput
from warcore.runners.batch import ForwardBatch, StaticBatch, StepInput
from warcore.runners.eager import EagerRunner
from warcore.runners.graph import GraphRunner, default_buckets

__all__ = [
    "EagerRunner",
    "ForwardBatch",
    "GraphRunner",
    "ModelRunner",
    "ReadDoneMailbox",
    "StaticBatch",
    "StepInput",
    "StepOutput",
    "default_buckets",
]
