"""warcore inside sglang 0.5.23: sglang's own declarations as a warcore plugin, and an
activation that makes sglang's declaration points answer through warcore.

* :mod:`warcore_sglang.plugin` (entry point ``warcore``: ``sglang``): sglang's in-tree
  declarations, asked of its real classes, as ``sglang_*`` backends and algorithms.
* :func:`install` / :func:`uninstall` (:mod:`warcore_sglang.activation`): patch sglang's
  declaration points in this process; ``WARCORE_SGLANG=1`` does it in every sglang server
  process through sglang's ``sglang.srt.plugins`` entry point, and ``python -m
  warcore_sglang.launch_server ...`` sets it for you.
* ``python -m warcore_sglang.bench``: sglang's per-execute resolution against warcore's lookup.

Importing this package imports neither sglang nor torch.

What sglang 0.5.23 does, read in its source and confirmed by calling its code (the facts the
plugin and the activation build on; ``sglang/srt/`` paths):

* ``layers/attention/base_attn_backend.py``: ``SharedReadEnds`` (PRE < IN < POST < UNKNOWN,
  ``max_of`` the latest); the base declares DECODE and TARGET_VERIFY ``IN_REPLAY``, else
  UNKNOWN; ``resolve_prefill_shared_read_ends`` (only defined there) checks
  ``SGLANG_FORCE_COARSE_WAR_BARRIER`` / ``SGLANG_ENABLE_PREFILL_WAR_READ_DONE`` (``EnvBool(True)``
  in ``srt/environ.py``: on unless set false) and exactly EXTEND, then the per-batch
  ``_snapshot_prefill_shared_reads`` or the static declaration. sglang main's opt-out
  ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER`` (#37958) is read instead under
  ``WARCORE_SGLANG_PREFILL_SWITCH=main`` (:data:`ENV_PREFILL_SWITCH`).
* Of the 23 registry names only ``trtllm_mha`` (EXTEND ``PRE_REPLAY``) and ``dsv4`` on CUDA
  (TARGET_VERIFY ``POST_REPLAY``, ``IN_REPLAY`` only when ``spec_algorithm.is_dspark()``:
  DFLASH is POST too; its prefill snapshots per batch) declare of their own. Wrappers: hybrid
  selects a child (verify per ``spec_attn_is_decode``), two-batch overlap / hybrid linear /
  MiniMax take the latest of their children, ``DotsSWAMLAAttnBackend`` is UNKNOWN for plain
  extend, ``DotsHybridAttnBackend`` declares nothing; ``MiniMaxSparseNvfp4AttnBackend`` is
  ``PRE_REPLAY`` in every mode, the only backend declaring anything for DRAFT_EXTEND_V2.
* So EAGLE-family steps are coarse in 0.5.23 (their owner, the draft runner's draft-extend,
  declares UNKNOWN) except with MiniMax-nvfp4; multi-layer EAGLE's draft-extend runner never
  publishes, so its steps are coarse unless the draft-extend was staged (then the target's
  verify event is taken).
* ``DecodeCudaGraphRunner._resolve_shared_read_ends`` runs on every ``execute``: the
  declaration, IN_REPLAY without ``in_graph_metadata_prep_done`` -> POST_REPLAY. UNKNOWN
  publishes nothing and does not clear ``model_runner.shared_read_done_event`` (the EAGLE
  draft-extend runner clears first; the prefill gate does not): the scheduler clears only the
  owner's mailbox each step (``Scheduler._apply_war_barrier``).
* The prefill gate (``runner_utils/shared_read_event.py``) publishes only for PRE_REPLAY, an
  algorithm whose ``supports_prefill_shared_read_done()`` (NONE, DFLASH, DSPARK; custom:
  False), and no hierarchical cache, hicache storage or LMCache.
* ``load_plugins()`` (``plugins/__init__.py``) runs the ``sglang.srt.plugins`` entry points
  first thing in ``launch_server``, ``sglang serve``, ``Engine``, every scheduler child
  (``run_scheduler_process``), the DP controller and the detokenizer; the children are
  started with ``spawn`` and inherit the environment. The runtime context is published after
  it, so the activation reads server args per call, never at install.
"""

from __future__ import annotations

from typing import Any

from ._names import SUPPORTED  # pure data
from ._prefill_switch import ENV_PREFILL_SWITCH  # standard library only
from ._rank_settings import ENV_CHECK_RANKS  # standard library only

__all__ = [
    "ENV_ACTIVATE",
    "ENV_CHECK_RANKS",
    "ENV_PREFILL_SWITCH",
    "SUPPORTED",
    "install",
    "is_installed",
    "uninstall",
]

__version__ = "0.1.0"

ENV_ACTIVATE = "WARCORE_SGLANG"
"""``1``: sglang's plugin loader activates warcore in every server process that may build a
model runner (each scheduler child; not the launcher, the detokenizer or the DP controller)."""


def install(**kwargs: Any) -> None:
    """Make sglang's declaration points answer through warcore in this process (idempotent).
    See :func:`warcore_sglang.activation.install`."""
    from .activation import install as _install

    _install(**kwargs)


def uninstall() -> None:
    """Restore every attribute :func:`install` patched, exactly (idempotent)."""
    from .activation import uninstall as _uninstall

    _uninstall()


def is_installed() -> bool:
    from .activation import is_installed as _is_installed

    return _is_installed()
