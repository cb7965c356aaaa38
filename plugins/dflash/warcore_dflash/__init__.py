"""warcore plugin for the ``dflash`` and ``dspark`` speculative algorithms (entry point ``dflash``).

Both belong to the dflash family: a block drafter proposes a whole block, the target verifies it
in one forward, and no draft-extend follows the verify. So the target's verify (and its prefill
``EXTEND``) is the step's last reader of scheduler-shared buffers: that is where a read-done
event is published. The step says so as data (:data:`STEP`, ``warcore.core.DFLASH_STEP``); the
publish-phase hook below says it too, and ``warcore check`` compares the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import warcore
from warcore import AlgorithmSpec, ForwardMode, Phase, StepSpec

__all__ = [
    "ALGORITHMS",
    "STEP",
    "warcore_is_war_publish_phase",
    "warcore_speculative_algorithms",
]

ALGORITHMS = ("dflash", "dspark")

STEP = StepSpec(
    prefill=(Phase("target", ForwardMode.EXTEND),),
    decode=(Phase("target", ForwardMode.TARGET_VERIFY),),
    propose=True,
)
"""Verify the block (the step's last shared reader: the target owns the event), commit, then
the block drafter proposes the next block (it reads no shared buffer)."""

_PUBLISH_PHASES = frozenset({ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND})


def _dflash_drafter(target: Any, num_draft: int, device: Any) -> Any:
    from warcore_dflash.drafter import BlockDrafter

    return BlockDrafter(target, num_draft, device)


def _dspark_drafter(target: Any, num_draft: int, device: Any) -> Any:
    from warcore_dflash.drafter import BlockDrafter

    return BlockDrafter(target, num_draft, device, markov=True)


@warcore.hookimpl
def warcore_speculative_algorithms() -> Iterable[AlgorithmSpec]:
    return [
        AlgorithmSpec(
            "dflash",
            "dflash",
            "block-diffusion drafter; the target verifies a block at once",
            drafter=_dflash_drafter,
            step=STEP,
            models="sglang_dflash",
        ),
        AlgorithmSpec(
            "dspark",
            "dflash",
            "dflash with a low-rank previous-token bias (Markov head)",
            drafter=_dspark_drafter,
            step=STEP,
            models="sglang_dspark",
        ),
    ]


@warcore.hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    if algorithm not in ALGORITHMS:
        return None
    return forward_mode in _PUBLISH_PHASES
