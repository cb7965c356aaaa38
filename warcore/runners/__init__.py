"""Runners: execute a forward and record its read-done event at the decided point (the names
below are imported on first use; they need torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore._lazy import lazy_exports

if TYPE_CHECKING:
    from warcore.runners._runner import (
        PROMPT_MODES,
        ForwardProbe,
        ModelRunner,
        ReadDoneMailbox,
        StepOutput,
        Work,
    )
    from warcore.runners.eager import EagerRunner
    from warcore.runners.graph import GraphRunner, default_buckets
    from warcore.runners.group import RunnerGroup

_EXPORTS = {
    "ForwardProbe": "warcore.runners._runner",
    "Work": "warcore.runners._runner",
    "PROMPT_MODES": "warcore.runners._runner",
    "ModelRunner": "warcore.runners._runner",
    "ReadDoneMailbox": "warcore.runners._runner",
    "StepOutput": "warcore.runners._runner",
    "EagerRunner": "warcore.runners.eager",
    "GraphRunner": "warcore.runners.graph",
    "default_buckets": "warcore.runners.graph",
    "RunnerGroup": "warcore.runners.group",
}

__all__ = [
    "PROMPT_MODES",
    "EagerRunner",
    "ForwardProbe",
    "GraphRunner",
    "ModelRunner",
    "ReadDoneMailbox",
    "RunnerGroup",
    "StepOutput",
    "Work",
    "default_buckets",
]

__getattr__ = lazy_exports(__name__, _EXPORTS)
