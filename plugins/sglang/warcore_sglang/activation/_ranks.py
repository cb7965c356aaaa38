"""The rank check inside sglang: :func:`warcore.audit.ranks.check_ranks_agree` at scheduler start.

Each tensor- or pipeline-parallel rank of an sglang server is its own scheduler process and
resolves warcore's decisions on its own; a rank with another plugin set or environment would
publish at another point without a word. With ``WARCORE_SGLANG_CHECK_RANKS`` (or
``install(check_ranks=True)``) every ``Scheduler.__init__`` ends with the core's rank check over
sglang's world CPU group, on the cells this server can meet (:func:`rank_cells`): ``1`` raises
naming the ranks and cells, ``warn`` logs. The check itself, its fingerprint and its timeout
are the core's (:mod:`warcore.audit.ranks`); this module only says when, over which group and
which cells.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from warcore import BoundaryContext, ForwardMode
from warcore.core import WarcorePluginManager, get_registry

from .. import ENV_CHECK_RANKS, _sglang
from . import _state
from ._identity import offload_flags, process_algorithm

_TRUE = {"1", "true", "yes", "on"}
_MODES = (
    ForwardMode.EXTEND,
    ForwardMode.DECODE,
    ForwardMode.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND_V2,
)
"""The four modes an sglang runner publishes in."""


_requested: bool | None = None
"""``install(check_ranks=...)``; ``None``: ``WARCORE_SGLANG_CHECK_RANKS`` decides."""


def set_requested(check_ranks: bool | None) -> None:
    global _requested
    _requested = check_ranks


def _mode() -> str | None:
    """``raise``, ``warn`` or ``None`` (no check): ``install(check_ranks=True)``, else
    ``WARCORE_SGLANG_CHECK_RANKS``."""
    flag = os.environ.get(ENV_CHECK_RANKS, "").strip().lower()
    if flag == "warn":
        return "warn"
    if flag in _TRUE or _requested:
        return "raise"
    return None


def rank_cells(pm: WarcorePluginManager | None = None) -> list[tuple[str, ForwardMode, Any]]:
    """The cells every rank of this server must decide alike: each sglang backend in the four
    publishing modes, under this process's algorithm and offload flags."""
    pm = pm if pm is not None else _state.pm()
    name = _sglang.warcore_algorithm(process_algorithm()) or "none"
    ctx = BoundaryContext(name, offload_flags())
    backends = sorted(
        n for n, offer in get_registry(pm).backends.items() if offer.spec.engine == "sglang"
    )
    return [(b, m, ctx) for b in backends for m in _MODES]


def _check_ranks(*, raise_on_mismatch: bool) -> None:
    """The core's rank check over sglang's world CPU group (``None`` outside a server: the
    default group)."""
    from warcore.audit.ranks import check_ranks_agree

    group = None
    with contextlib.suppress(Exception):
        from sglang.srt.runtime_context import get_parallel

        group = get_parallel().world_group.cpu_group
    check_ranks_agree(group, rank_cells(), pm=_state.pm(), raise_on_mismatch=raise_on_mismatch)


def check_if_requested() -> None:
    """The rank check at the end of ``Scheduler.__init__``, while it is asked for."""
    mode = _mode()
    if _state.current is not None and mode is not None:
        _check_ranks(raise_on_mismatch=mode != "warn")
