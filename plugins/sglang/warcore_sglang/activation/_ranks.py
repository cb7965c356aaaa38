"""The rank check inside sglang: :func:`warcore.audit.ranks.check_ranks_agree` at scheduler start.

Each tensor-, pipeline- or data-parallel rank of an sglang server is its own scheduler process
and resolves warcore's decisions on its own; a rank with another plugin set or environment
would publish at another point without a word. With ``WARCORE_SGLANG_CHECK_RANKS`` (or
``install(check_ranks=True)``) every ``Scheduler.__init__`` ends with the core's rank check over
sglang's world CPU group, on the cells this server can meet (:func:`rank_cells`) and one fact:
whether warcore-sglang is active on this rank (a rank whose activation took itself off joins
the check and differs there). ``1``: disagreeing ranks raise, naming the ranks and the cells,
so every rank's start-up fails. ``warn``: every rank logs it and serves with the cells that
disagree coarse (on every rank, since each computes the same set from the same answers; a fact
that differs makes every cell coarse). A rank that does not answer within
``WARCORE_SGLANG_CHECK_RANKS_TIMEOUT`` seconds (default the core's 60) is named on every rank
that waited. The check itself, its fingerprint and the exchange are the core's
(:mod:`warcore.audit.ranks`); this module says when, over which group, which cells and facts,
and what ``warn`` does with the result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from warcore import BoundaryContext, ForwardMode
from warcore.core import WarcorePluginManager, get_plugin_manager, get_registry

from ..declarations import oracle
from ..settings import ENV_TIMEOUT, check_ranks_mode, timeout_s
from . import _state
from ._identity import offload_flags, process_algorithm

logger = logging.getLogger("warcore.sglang")

FACT = "warcore-sglang"
"""The fact every rank adds to its decisions: whether its activation is on."""

_MODES = (
    ForwardMode.EXTEND,
    ForwardMode.DECODE,
    ForwardMode.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND_V2,
)
"""The four modes an sglang runner publishes in."""


_requested: bool | None = None
"""``install(check_ranks=...)``; ``None``: ``WARCORE_SGLANG_CHECK_RANKS`` decides."""
refused: str | None = None
"""Why this rank's sglang release was refused, while a refused rank still joins the check
(so that the others refuse naming both releases, instead of waiting for it to time out)."""


def set_requested(check_ranks: bool | None, why_refused: str | None = None) -> None:
    global _requested, refused
    _requested, refused = check_ranks, why_refused


def requested(check_ranks: bool | None) -> bool:
    """Whether the rank check is asked for (``install(check_ranks=...)``, else the variable)."""
    mode, _ = check_ranks_mode(os.environ)
    return bool(check_ranks) or (check_ranks is None and mode is not None)


def _mode() -> str | None:
    """``raise``, ``warn`` or ``None`` (no check): ``install(check_ranks=True)``, else
    ``WARCORE_SGLANG_CHECK_RANKS`` (a bad value: off, said in the start-up line)."""
    mode, _ = check_ranks_mode(os.environ)
    if mode is None and _requested:
        return "raise"
    return mode


def timeout() -> float:
    """``WARCORE_SGLANG_CHECK_RANKS_TIMEOUT`` in seconds; the core's default when unset or
    not a plain number of seconds in (0, a day] (said in the start-up line)."""
    from warcore.audit.ranks import DEFAULT_TIMEOUT_S

    seconds, _ = timeout_s(os.environ)
    return DEFAULT_TIMEOUT_S if seconds is None else seconds


def _live_backends(scheduler: Any) -> list[Any]:
    """The attention backends of the scheduler's model runners (target, draft)."""
    worker = getattr(scheduler, "model_worker", None)
    runners = [
        getattr(worker, "model_runner", None),
        getattr(getattr(worker, "target_worker", None), "model_runner", None),
        getattr(getattr(worker, "draft_worker", None), "model_runner", None),
        getattr(worker, "draft_runner", None),
    ]
    found: list[Any] = []
    for runner in runners:
        backend = getattr(runner, "attn_backend", None)
        if backend is not None and all(backend is not b for b in found):
            found.append(backend)
    return found


def rank_cells(
    pm: WarcorePluginManager | None = None, scheduler: Any = None
) -> list[tuple[str, ForwardMode, Any]]:
    """The cells every rank of this server must decide alike: each attention backend this
    scheduler's model runners use (its warcore name and context, a wrapper's children named in
    it), else every sglang backend warcore knows, in the four publishing modes, under this
    process's algorithm and offload flags."""
    from ._identity import identify

    cells = []
    with contextlib.suppress(Exception):  # no scheduler, or a backend it cannot name
        for backend in _live_backends(scheduler):
            name, ctx = identify(backend)
            if name is not None:
                cells += [(name, m, ctx) for m in _MODES]
    if cells:
        return cells
    pm = pm if pm is not None else get_plugin_manager()
    name = oracle.warcore_algorithm(process_algorithm()) or "none"
    ctx = BoundaryContext(name, offload_flags())
    backends = sorted(
        n for n, offer in get_registry(pm).backends.items() if offer.spec.engine == "sglang"
    )
    return [(b, m, ctx) for b in backends for m in _MODES]


def _fact() -> str:
    state = _state.current
    if state is not None:
        return f"active on audited sglang {state.release.version}"
    if refused is not None:
        return f"refused: sglang {oracle.installed_version()} is not an audited release"
    return f"off: {_state.activation.degraded_check or 'not installed'}"


def _check_ranks(*, raise_on_mismatch: bool, scheduler: Any = None) -> Any:
    """The core's rank check over sglang's world CPU group (``None`` outside a server: the
    default group); returns its report."""
    from warcore.audit.ranks import RankCheckTimeout, check_ranks_agree

    group = None
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_parallel

        group = get_parallel().world_group.cpu_group
    seconds = timeout()
    try:
        return check_ranks_agree(
            group,
            rank_cells(scheduler=scheduler),
            pm=get_plugin_manager(),
            raise_on_mismatch=raise_on_mismatch,
            timeout=seconds,
            facts={FACT: _fact()},
        )
    except RankCheckTimeout as exc:  # say which knob sets it here
        message = f"{exc} ({ENV_TIMEOUT}, now {seconds:g} s)"
        raise RankCheckTimeout(message, exc.missing, exc.answered) from None


def _coarse_where_they_differ(report: Any) -> None:
    """``warn``: the cells the ranks disagree on are coarse from now on, in this process."""
    from warcore.audit.ranks import cell_of

    state = _state.current
    if state is None:
        return  # warcore is off here: sglang's own decisions apply
    cells = report.differing_cells()
    found = [cell_of(key) for key in cells]
    state.coarse = (
        frozenset({"*"})
        if any(c is None for c in found)
        else frozenset((c[0], c[1]) for c in found if c is not None)
    )
    _state.invalidate()
    logger.warning(
        "warcore-sglang: %s: the ranks disagree on %d cell(s) (WARCORE_SGLANG_CHECK_RANKS=warn): "
        "%s coarse on this rank",
        f"process {os.getpid()}",
        len(cells),
        "every cell" if "*" in state.coarse else "those cells",
    )


def _process_seconds() -> float | None:
    """How long this process has lived (its start-up so far, at the end of the scheduler's
    constructor), or ``None`` where that cannot be read."""
    try:
        import psutil  # sglang's own dependency

        return time.time() - float(psutil.Process(os.getpid()).create_time())
    except Exception:
        return None


def check_if_requested(scheduler: Any = None) -> None:
    """The rank check at the end of ``Scheduler.__init__``, while it is asked for (also where
    the activation took itself off: that rank joins, and differs); one line says what it cost
    of this scheduler's start-up."""
    mode = _mode()
    off = _state.current is None and _state.activation.degraded_check is None
    if mode is None or (off and refused is None):
        return
    began = time.monotonic()
    report = _check_ranks(raise_on_mismatch=mode != "warn", scheduler=scheduler)
    took = time.monotonic() - began
    if mode == "warn" and not report.agree:
        _coarse_where_they_differ(report)
    lived = _process_seconds()
    share = f", {took / lived:.2%} of this scheduler's start-up ({lived:.1f} s)" if lived else ""
    logger.info(
        "warcore-sglang: process %d: the rank check took %.3f s (resolving %.3f s, waiting for "
        "the other ranks %.3f s)%s",
        os.getpid(),
        took,
        report.resolve_s,
        report.exchange_s,
        share,
    )
