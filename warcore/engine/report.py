"""What a run did: :class:`RunReport`, and its comparison with the serial loop's."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from warcore.core import ForwardMode, RecordPoint
from warcore.device import WaitBinding
from warcore.engine.config import EngineConfig
from warcore.engine.hicache import PrefixCacheStats

__all__ = ["RunReport", "compare_with_serial"]


@dataclass
class RunReport:
    config: EngineConfig
    device: str
    requests: int
    tokens: int
    elapsed_s: float
    steps: int
    forwards: Counter[ForwardMode]
    """Launched steps by the step's target forward mode (one per step, however many forwards
    the algorithm's step runs: EAGLE's draft steps and draft-extend are not counted apart)."""
    published: Counter[tuple[ForwardMode, RecordPoint]]
    """Per (forward mode, record point): forwards of every runner (target and draft)."""
    barriers: Counter[str]
    outputs: dict[int, list[int]]
    errors: dict[int, str]
    rows_reused: int = 0
    verifies: int = 0
    """Request-verifies: one per request per target verify."""
    accepted_drafts: int = 0
    stopped: str | None = None
    """The device fault that stopped the run, if one did."""
    drafter_problems: list[str] = field(default_factory=list)
    """How the algorithm's drafter broke its contract in this run (invalid drafts replaced, a
    method that raised), one line each naming the algorithm and its plugin. The tokens are
    still correct: a wrong draft costs acceptance only."""
    stager_problems: list[str] = field(default_factory=list)
    """How the algorithm's ``prefill_shared_read_stager`` failed in this run (it raised, or
    answered a non-bool), one line each naming the algorithm and its plugin; each such batch
    counted as not staged (no early publish), so the tokens are unaffected."""
    staged_prefills: int = 0
    """Prefill forwards whose stager staged the step's later reads (they published early
    where their decision allowed it)."""
    bindings: list[WaitBinding] = field(default_factory=list)
    """Every wait on a read-done event, in issue order: the forward it meant and the record
    it bound to (:func:`warcore.audit.bindings.audit_bindings` judges them)."""
    matches_serial: bool | None = None
    """Whether the tokens equal those of the serial loop; ``None``: not compared (not asked,
    or requests failed in either run: see :func:`compare_with_serial`)."""
    serial_errors: int = 0
    """Requests that failed in the serial run this one was compared with."""
    prefix_cache: PrefixCacheStats | None = None
    """The host KV tier's lookups, hits and copies (``None``: the ``hicache`` flag is off)."""
    staging_stalls: int = 0
    """Forwards whose host staging slot was still unreleased, so the host waited for it
    (a guarded ring shallower than the steps in flight); 0 at the derived depth."""

    @property
    def idle_steps(self) -> int:
        """Steps that launched nothing: waiting for the next request to arrive, or only
        collecting the forward still in flight. ``steps`` is the scheduler's step clock (it
        also times arrivals), so ``idle_steps + sum(forwards.values()) == steps``."""
        return self.steps - sum(self.forwards.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean draft tokens accepted per verify (the bonus token not counted)."""
        return self.accepted_drafts / self.verifies if self.verifies else 0.0


def compare_with_serial(report: RunReport, serial: RunReport) -> bool | None:
    """Set and return ``report.matches_serial``: whether its tokens equal the serial run's,
    or ``None`` when either run had failed requests (an empty output equals an empty output,
    which says nothing about a fence). ``report.serial_errors`` counts the serial run's."""
    report.serial_errors = len(serial.errors)
    failed = report.errors or serial.errors or report.stopped or serial.stopped
    report.matches_serial = None if failed else serial.outputs == report.outputs
    return report.matches_serial
