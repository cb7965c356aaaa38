"""warcore plugin for the ``ngram`` speculative algorithm (entry point ``ngram``): prompt lookup.

Its step, as data: the target verifies the drafts (``TARGET_VERIFY``), commits, and the
prompt-lookup drafter proposes the next drafts from the request's own tokens, on the host.
Nothing runs after the verify that reads the scheduler-shared buffers (the drafter reads only
the committed tokens), so **the verify is the step's last shared reader**: the target runner
owns the step's read-done event, and the target's ``EXTEND`` is the prefill's last reader.

That is this plugin's publish-phase declaration, stated once, in :data:`STEP`: with no plugin
answering ``warcore_is_war_publish_phase`` or ``warcore_step_event_owner`` for ``ngram``, the
core answers from the step (``warcore matrix`` shows ``step:ngram``). ``tests/test_ngram.py``
checks it with the sanitizer.

This module is what the entry point loads in every ``warcore`` process: it imports only
warcore's vocabulary (no torch); the drafter class is imported by the factory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import warcore
from warcore import AlgorithmSpec, ForwardMode, Phase, StepSpec

if TYPE_CHECKING:
    from warcore_ngram.drafter import PromptLookupDrafter

__all__ = ["ALGORITHM", "STEP", "warcore_speculative_algorithms"]

ALGORITHM = "ngram"

STEP = StepSpec(
    prefill=(Phase("target", ForwardMode.EXTEND),),
    decode=(Phase("target", ForwardMode.TARGET_VERIFY, last_reader=True),),
    propose=True,  # after the commit: the drafter writes the next verify's drafts
    acceptance="greedy_prefix",
)
"""Verify (the last shared reader, so the target owns the event), commit, propose."""


def _make_drafter(target: Any, num_draft: int, device: Any) -> PromptLookupDrafter:
    from warcore_ngram.drafter import PromptLookupDrafter

    return PromptLookupDrafter(num_draft)


@warcore.hookimpl
def warcore_speculative_algorithms() -> Iterable[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            ALGORITHM,
            "ngram",
            "prompt lookup: propose what followed the last n-gram earlier in the request",
            drafter=_make_drafter,
            step=STEP,
        )
    ]
