"""What warcore adds to each batch of a real scheduler, timed where it happens (opt-in).

With ``WARCORE_SGLANG_METER=FILE`` when the activation is installed, every patched declaration
point is timed (its own time, nested calls counted once), and each batch of the scheduler's
loop, from ``Scheduler.run_batch`` to the end of its ``_apply_war_barrier``, appends one JSON
line to FILE: the forward mode, warcore's nanoseconds in that batch, how many patched calls
they were, and the batch's nanoseconds. The end-to-end tokens per second of a CPU server cannot
resolve a 1% cost on shared cores (the A/A control of ``python -m warcore_sglang.bench_server``
spread 0.60-1.95); this can. The timer's own cost (two clock reads per call) is counted as
warcore's: the figure is an upper bound.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..trace import write_record

__all__ = ["ENV_METER", "path", "timed", "timed_batches"]

ENV_METER = "WARCORE_SGLANG_METER"

_local = threading.local()
logger = logging.getLogger("warcore.sglang")


def path() -> str | None:
    """FILE from ``WARCORE_SGLANG_METER`` (``None``: not metering)."""
    value = os.environ.get(ENV_METER, "").strip()
    return os.path.abspath(value) if value else None


def _count(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_local, "depth", 0)
        _local.depth = depth + 1
        start = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            _local.depth = depth
            if depth == 0:
                _local.ns = getattr(_local, "ns", 0) + time.perf_counter_ns() - start
                _local.calls = getattr(_local, "calls", 0) + 1

    counted.__warcore_original__ = function  # type: ignore[attr-defined]
    return counted


def timed(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``make`` (a patched point's factory), its product timed: a function or a property."""

    def timed_make(original: Any) -> Any:
        patched = make(original)
        if isinstance(patched, property):
            assert patched.fget is not None
            out = type(patched)(_count(patched.fget), patched.fset, patched.fdel)
            out.__warcore_original__ = original  # type: ignore[attr-defined]
            return out
        return _count(patched)

    return timed_make


_broken: set[str] = set()
"""Meter files a write failed on: metering into them stopped (one line said so)."""


def _write(file: str, record: dict[str, Any]) -> None:
    """Append ``record`` (one write: the ranks of a server share the file); a file that fails
    stops metering in one line, never the scheduler's batch."""
    if file in _broken:
        return
    try:
        write_record(file, record)
    except OSError as exc:
        _broken.add(file)
        logger.error(
            "warcore-sglang: %s=%s: %s; metering off in this process (pid %d)",
            ENV_METER,
            file,
            exc.strerror or exc,
            os.getpid(),
        )


def timed_batches(
    run_batch: Callable[..., Any], barrier: Callable[..., Any], file: str
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``Scheduler.run_batch`` and ``_apply_war_barrier`` wrapped to write one line per batch."""

    @functools.wraps(run_batch)
    def metered_run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        _local.ns = _local.calls = 0
        _local.batch_start = time.perf_counter_ns()
        _local.mode = str(getattr(getattr(batch, "forward_mode", None), "name", "?"))
        return run_batch(self, batch, *args, **kwargs)

    @functools.wraps(barrier)
    def metered_barrier(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return barrier(self, *args, **kwargs)
        finally:
            start = getattr(_local, "batch_start", None)
            if start is not None:
                record = {
                    "pid": os.getpid(),
                    "mode": _local.mode,
                    "warcore_ns": _local.ns,
                    "calls": _local.calls,
                    "batch_ns": time.perf_counter_ns() - start,
                }
                _local.batch_start = None
                _write(file, record)

    metered_run_batch.__warcore_original__ = run_batch  # type: ignore[attr-defined]
    metered_barrier.__warcore_original__ = barrier  # type: ignore[attr-defined]
    return metered_run_batch, metered_barrier
