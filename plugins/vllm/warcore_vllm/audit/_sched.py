"""vLLM 0.33.0's scheduler-side KV lifetime, on its real ``AsyncScheduler``: the deferred block
free (#45357) and the sliding-window free on the settled basis (#47728).

The oracle is independent of the scheduler's own bookkeeping: a step that scheduled a request
is *in flight* from ``schedule()`` until its output went through ``update_from_output``; while
it is, every block the step may write (the request's blocks) or read (for sliding-window
attention, every block from ``first position - window + 1`` on) must stay out of the free pool
(its ``ref_cnt`` above 0). A block found free while an in-flight step still touches it is a
violation, named with the step and the block.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import _harness
from ._harness import BLOCK, Configuration

__all__ = ["FreeReport", "deferred_free", "swa_free"]


@dataclass
class FreeReport:
    steps: int = 0
    checks: int = 0
    deferred: bool = False
    problems: list[str] = field(default_factory=list)


@dataclass
class _InFlight:
    step: int
    output: Any
    touches: dict[str, set[int]]
    """Request id -> the blocks this step may write or read."""


def _blocks(sched: Any, req_id: str) -> list[Any]:
    groups = sched.kv_cache_manager.get_blocks(req_id).blocks
    return [b for b in groups[0] if not b.is_null]


def _check(sched: Any, flight: deque[_InFlight], report: FreeReport, when: str) -> None:
    pool = sched.kv_cache_manager.block_pool.blocks
    for step in flight:
        for req_id, ids in step.touches.items():
            for block_id in sorted(ids):
                report.checks += 1
                if pool[block_id].ref_cnt == 0:
                    report.problems.append(
                        f"block {block_id} of {req_id} is back in the free pool {when}, while "
                        f"step {step.step} (not yet through update_from_output) still touches it"
                    )


def _touches(sched: Any, so: Any, window: int | None) -> dict[str, set[int]]:
    touches: dict[str, set[int]] = {}
    for req_id, count in so.num_scheduled_tokens.items():
        request = sched.requests[req_id]
        first = request.num_computed_tokens - count  # schedule() already advanced it
        low = 0 if window is None else max(0, first - window + 1) // BLOCK
        table = sched.kv_cache_manager.get_blocks(req_id).blocks[0]
        touches[req_id] = {b.block_id for b in table[low:] if not b.is_null}
    return touches


def _serve(
    sched: Any, report: FreeReport, steps: int, window: int | None, abort_at: int | None
) -> None:
    from vllm.v1.request import RequestStatus

    depth = sched.vllm_config.max_concurrent_batches
    flight: deque[_InFlight] = deque()
    for step in range(steps):
        so = sched.schedule()
        report.steps += 1
        flight.append(_InFlight(step, so, _touches(sched, so, window)))
        _check(sched, flight, report, f"after schedule() of step {step}")
        if step == abort_at:
            sched.finish_requests(list(sched.requests), RequestStatus.FINISHED_ABORTED)
            _check(sched, flight, report, f"after the abort in step {step}")
        if len(flight) >= depth:
            done = flight.popleft()
            sched.update_from_output(done.output, _harness.model_output(done.output))
            _check(sched, flight, report, f"after step {done.step}'s output")
    while flight:
        done = flight.popleft()
        sched.update_from_output(done.output, _harness.model_output(done.output))


def deferred_free(cfg: Configuration) -> FreeReport:
    """One request prefilled and decoded, then aborted while two steps that wrote its blocks
    are in flight (#45357's shape: a KV consumer may load into freed blocks at once)."""
    vc = _harness.vllm_config(cfg, num_blocks=16)
    sched = _harness.scheduler(vc, num_blocks=16)
    report = FreeReport(deferred=bool(getattr(sched, "defer_block_free", False)))
    _harness.add_requests(sched, 1, prompt=40, max_tokens=8)
    _serve(sched, report, steps=4, window=None, abort_at=1)
    return report


def swa_free(cfg: Configuration) -> FreeReport:
    """A sliding-window request decoded past its window with steps in flight: the blocks the
    in-flight steps' windows still read must not be freed (#47728)."""
    window = cfg.sliding_window
    assert window is not None
    vc = _harness.vllm_config(cfg, num_blocks=16)
    sched = _harness.scheduler(vc, num_blocks=16)
    report = FreeReport()
    _harness.add_requests(sched, 1, prompt=3 * BLOCK, max_tokens=2 * BLOCK + 4)
    _serve(sched, report, steps=2 * BLOCK, window=window, abort_at=None)
    return report
