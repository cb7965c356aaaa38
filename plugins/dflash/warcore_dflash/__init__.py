"""warcore plugin for the ``dflash`` and ``dspark`` speculative algorithms (entry point ``dflash``).

Both belong to the dflash family: a block drafter proposes a whole block, the target verifies it
in one forward, and no draft-extend follows the verify. So the target's verify (and its prefill
``EXTEND``) is the step's last reader of scheduler-shared buffers: that is where a read-done
event is published.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import warcore
from warcore import AlgorithmSpec, ForwardMode

__all__ = ["ALGORITHMS", "warcore_is_war_publish_phase", "warcore_speculative_algorithms"]

ALGORITHMS = ("dflash", "dspark")

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
        ),
        AlgorithmSpec(
            "dspark",
            "dflash",
            "dflash with a low-rank previous-token bias (Markov head)",
            drafter=_dspark_drafter,
        ),
    ]


@warcore.hookimpl
def warcore_is_war_publish_phase(algorithm: str, forward_mode: ForwardMode) -> bool | None:
    if algorithm not in ALGORITHMS:
        return None
    return forward_mode in _PUBLISH_PHASES
