"""Watching the engine: a no-op observer to subclass (the trace exporter, tests).

Every method gets ``time.perf_counter()`` seconds. Host spans cover the loop's phases
(``schedule``, ``launch``, ``barrier``, ``collect``); device spans come from the device's span
sink (the sim device reports every launched work item; CUDA reports none); ``forward`` is called
when a runner launches a forward, with the record point it used.
"""

from __future__ import annotations

from warcore.core import ForwardMode, RecordPoint
from warcore.device import WaitBinding

__all__ = ["EngineObserver"]


class EngineObserver:
    def host_span(self, name: str, t0: float, t1: float, args: dict[str, object]) -> None:
        """A phase of the host loop."""

    def device_span(self, stream: str, label: str, t0: float, t1: float) -> None:
        """A work item that ran on a stream (sim device only)."""

    def forward(self, runner: str, mode: ForwardMode, point: RecordPoint, t: float) -> None:
        """A forward was launched on ``runner`` and records its read-done event at ``point``."""

    def barrier(self, kind: str, t: float) -> None:
        """The scheduler's WAR barrier: ``fine`` (waits on an event), ``coarse`` or ``none``."""

    def binding(self, binding: WaitBinding, t: float) -> None:
        """A consumer (``barrier``, ``copy``) waited on a read-done event: the forward it meant
        and the record it bound to."""
