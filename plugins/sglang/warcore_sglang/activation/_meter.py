"""What warcore adds to each batch of a real scheduler, timed where it happens (opt-in).

With ``WARCORE_SGLANG_METER=FILE`` when the activation is installed, every patched declaration
point is timed (its own time, nested calls counted once, sglang's code it calls timed apart),
and each batch of the scheduler's loop, from ``Scheduler.run_batch`` to the end of its
``_apply_war_barrier``, appends one JSON line to FILE: the forward mode, warcore's nanoseconds
in that batch, how many patched calls they were and each point's share (``by_point``), the
batch's nanoseconds, and the meter's own floor. The end-to-end tokens per second of a CPU
server cannot resolve a 1% cost on shared cores (the A/A control of ``python -m
warcore_sglang.serving.bench_server`` spread 0.60-1.95); this can.

The meter's own cost around a point (its wrapper, two clock reads, finding this thread's
tally) is counted as warcore's: the figure is an upper bound. Around the sglang code a point
calls, the clock is read first: finding the tally there is counted as sglang's (it was
counted as warcore's before 2026-12-05). ``floor_ns`` is what the meter counts for a point
that adds nothing, timed after the barrier (where the caches are warmer than at a point):
warcore_ns minus calls × floor_ns, the net figure, is an upper bound still.

The floor is warm; a point runs where the batch's forward has just left the caches cold, and
the meter's wrappers cost more there. With ``WARCORE_SGLANG_METER_CONTROL=1`` as well, every
other batch is a control: in place of each patched point, the meter's wrappers call sglang's
original itself (sglang's own answer, no frame or line of warcore's), at the same sites, in
the same process; its line says ``"control": true``. A control batch's figure is what the
meter counts for nothing there, so a real batch's minus a control batch's is warcore's own
cost at the same cache temperature, its patched function's frame included (``python -m
warcore_sglang.serving.bench_server`` turns it on and reports both). A control batch is not
bounded by warcore: a benchmark's setting only.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..audit.trace import write_record
from ..settings import ENV_METER, meter_control

__all__ = ["control", "path", "timed", "timed_batches"]


class _Tally:
    """One thread's figures for the batch it runs (slots: the meter's own cost, counted as
    warcore's, stays a few attribute reads)."""

    __slots__ = (
        "depth",
        "in_sglang",
        "own_ns",
        "points",
        "ns",
        "calls",
        "by_point",
        "batch_start",
        "mode",
        "batches",
        "control",
    )

    def __init__(self) -> None:
        self.depth = self.own_ns = self.points = self.ns = self.calls = 0
        self.by_point: dict[str, int] = {}
        """warcore's nanoseconds in this batch per patched point (its function's name)."""
        self.in_sglang = False
        self.batch_start: int | None = None
        self.mode = "?"
        self.batches = 0
        self.control = False
        """This batch's points call sglang's originals in warcore's place (the control)."""


_local = threading.local()
logger = logging.getLogger("warcore.sglang")


def _tally() -> _Tally:
    try:
        return _local.tally  # type: ignore[no-any-return]
    except AttributeError:
        _local.tally = _Tally()
        return _local.tally  # type: ignore[no-any-return]


def path() -> str | None:
    """FILE from ``WARCORE_SGLANG_METER`` (``None``: not metering)."""
    value = os.environ.get(ENV_METER, "").strip()
    return os.path.abspath(value) if value else None


def control() -> bool:
    """``WARCORE_SGLANG_METER_CONTROL`` on (with the meter): every other metered batch a
    control (a bad value is said in the start-up line: none)."""
    return meter_control(os.environ)[0]


def _count(
    function: Callable[..., Any], control: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """``function`` timed (``control`` runs instead in a control batch, timed the same)."""
    local, clock = _local, time.perf_counter_ns  # the meter's own cost is counted: kept small
    name, control = function.__name__, control or function

    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        tally = getattr(local, "tally", None) or _tally()
        call = control if tally.control else function  # chosen before the clock starts
        depth = tally.depth
        tally.depth = depth + 1
        own = tally.own_ns
        start = clock()
        try:
            return call(*args, **kwargs)
        finally:
            tally.depth = depth
            if depth == 0:
                spent = clock() - start
                mine = spent - (tally.own_ns - own)
                tally.points += spent
                tally.ns += mine
                tally.calls += 1
                tally.by_point[name] = tally.by_point.get(name, 0) + mine

    counted.__warcore_original__ = function  # type: ignore[attr-defined]
    return counted


def _sglangs(original: Callable[..., Any]) -> Callable[..., Any]:
    """sglang's own function as a patched point calls it, its time kept apart (outermost
    call only: what it calls of sglang is in it)."""

    local, clock = _local, time.perf_counter_ns

    @functools.wraps(original)
    def sglangs(*args: Any, **kwargs: Any) -> Any:
        # the clock first: finding this thread's tally is the meter's own work, not warcore's
        start = clock()
        tally = getattr(local, "tally", None) or _tally()
        if tally.in_sglang:
            return original(*args, **kwargs)
        tally.in_sglang = True
        try:
            return original(*args, **kwargs)
        finally:
            tally.in_sglang = False
            tally.own_ns += clock() - start

    sglangs.__warcore_original__ = original  # type: ignore[attr-defined]
    return sglangs


def timed(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``make`` (a patched point's factory), its product timed, the original it calls timed
    apart: a function or a property (sglang's getter timed apart too); the control, that
    timed original alone, beside it."""

    def timed_make(original: Any) -> Any:
        if isinstance(original, property):
            assert original.fget is not None
            fget = _sglangs(original.fget)
            patched = make(property(fget, original.fset, original.fdel))
            assert patched.fget is not None
            timed_fget = _count(patched.fget, fget)
            out = type(patched)(timed_fget, patched.fset, patched.fdel)
            out.__warcore_original__ = original
            return out
        sglangs = _sglangs(original)
        return _count(make(sglangs), sglangs)

    return timed_make


def _pass_through(original: Callable[..., Any]) -> Callable[..., Any]:
    def point(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    return point


_NULL_POINT = _count(_pass_through(_sglangs(lambda: None)))
"""A patched point that only calls sglang's original, timed as the real ones are."""


def _floor(tally: _Tally) -> int:
    """What the meter itself counts for a point that adds nothing (its clock reads, its
    wrappers), timed after the batch's barrier; the batch's figures are left as they were."""
    saved = tally.ns, tally.points, tally.calls, tally.by_point
    tally.by_point = {}
    _NULL_POINT()
    floor = tally.ns - saved[0]
    tally.ns, tally.points, tally.calls, tally.by_point = saved
    return floor


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
    run_batch: Callable[..., Any], barrier: Callable[..., Any], file: str, control: bool = False
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``Scheduler.run_batch`` and ``_apply_war_barrier`` wrapped to write one line per batch
    (``control``: every other batch a control)."""

    @functools.wraps(run_batch)
    def metered_run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        tally = _tally()
        tally.ns = tally.calls = tally.points = 0
        tally.by_point = {}
        tally.batch_start = time.perf_counter_ns()
        tally.mode = str(getattr(getattr(batch, "forward_mode", None), "name", "?"))
        tally.batches += 1
        tally.control = control and tally.batches % 2 == 0
        return run_batch(self, batch, *args, **kwargs)

    @functools.wraps(barrier)
    def metered_barrier(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return barrier(self, *args, **kwargs)
        finally:
            tally = _tally()
            if tally.batch_start is not None:
                batch_ns = time.perf_counter_ns() - tally.batch_start
                record = {
                    "pid": os.getpid(),
                    "mode": tally.mode,
                    "warcore_ns": tally.ns,
                    "points_ns": tally.points,
                    "calls": tally.calls,
                    "by_point": tally.by_point,
                    "batch_ns": batch_ns,
                    "floor_ns": _floor(tally),
                    "control": tally.control,
                }
                tally.batch_start, tally.control = None, False
                _write(file, record)

    metered_run_batch.__warcore_original__ = run_batch  # type: ignore[attr-defined]
    metered_barrier.__warcore_original__ = barrier  # type: ignore[attr-defined]
    return metered_run_batch, metered_barrier
