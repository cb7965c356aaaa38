"""Runners: execute a forward and record its read-done event at the decided point."""

from warcore.runners._probe import ForwardProbe
from warcore.runners._runner import PROMPT_MODES, ModelRunner, ReadDoneMailbox, StepOutput
from warcore.runners.eager import EagerRunner
from warcore.runners.graph import GraphRunner, default_buckets
from warcore.runners.group import RunnerGroup

__all__ = [
    "PROMPT_MODES",
    "EagerRunner",
    "ForwardProbe",
    "GraphRunner",
    "ModelRunner",
    "ReadDoneMailbox",
    "RunnerGroup",
    "StepOutput",
    "default_buckets",
]
