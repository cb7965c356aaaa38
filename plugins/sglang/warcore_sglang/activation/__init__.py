"""Activation: make a running sglang 0.5.23 process consult warcore.

:func:`install` patches sglang's declaration points in this process so that installed warcore
plugins, vetoes and force-coarse act on sglang's real runners:

=====================================================  =====================================
patched (sglang 0.5.23)                                answers
=====================================================  =====================================
``shared_read_ends`` of ``AttentionBackend`` and of    warcore's resolution for the backend's
every subclass defining its own (also classes         warcore name and this process's context,
defined later: ``AttentionBackend.__init_subclass__``) never earlier than sglang's own answer
                                                       for the instance; a veto, force-coarse,
                                                       or a non-publishing phase -> UNKNOWN;
                                                       cached per instance
``AttentionBackend.resolve_prefill_shared_read_ends``  sglang's env switches (the prefill one
                                                       as ``WARCORE_SGLANG_PREFILL_SWITCH``
                                                       says), then warcore's
                                                       prefill decision (declaration, vetoes,
                                                       the algorithm's gate); on the snapshot
                                                       path sglang's per-batch snapshot, never
                                                       earlier than another plugin's answer
``SpeculativeAlgorithm`` / ``CustomSpecAlgo``          warcore's publish phase for ``EXTEND``
``.supports_prefill_shared_read_done``
``last_shared_read_runner`` of ``BaseTpWorker``,       the runner warcore's event owner names
``BaseSpecWorker`` and each spec worker defining it    for (algorithm, facts read from the
                                                       worker); no owner -> a runner with no
                                                       event (coarse barrier)
``DecodeCudaGraphRunner._resolve_shared_read_ends``    a dict lookup (backend, planted?, mode)
                                                       filled from the backend's patched
                                                       answer (IN_REPLAY without an in-graph
                                                       event -> POST_REPLAY, as sglang); emptied
                                                       when plugins or switches change
=====================================================  =====================================

Plus two small wraps: ``attention_backend_setup._build_full_attention_backend_from_str`` tags
each backend sglang's registry builds with its warcore name (``fa3`` and ``fa4`` build one
class), and, with ``WARCORE_SGLANG_CHECK_RANKS``, ``Scheduler.__init__`` ends with the rank
check (:func:`warcore.audit.ranks.check_ranks_agree` over sglang's world CPU group).

Where an UNKNOWN answer reaches the decode runner, the runner's mailbox
(``model_runner.shared_read_done_event``) is cleared: sglang's runner does not clear it, and an
event an earlier phase left there must not stand for a forward that publishes nothing.

Modules not imported yet are patched when they are imported (a post-import hook on
``sys.meta_path``), so :func:`install` imports nothing of sglang itself: it is what sglang's
``load_plugins()`` calls (entry point ``sglang.srt.plugins``: ``warcore``) first thing in
every server process when ``WARCORE_SGLANG=1`` (through :mod:`warcore_sglang._entry`, which
activates only where a model runner may be built). :func:`uninstall` removes the hook and restores
every patched attribute exactly (the same objects; an attribute that was inherited is deleted
again).

The package, one concept a module: :mod:`._state` (the installed state, the generation that
keys every cached answer), :mod:`._machinery` (patching so that it can be put back exactly),
:mod:`._identity` (a live backend's warcore name and context), :mod:`._answers` (warcore's
answer for an instance, with its provenance), :mod:`._points` and :mod:`._owner` (the patched
methods and property), :mod:`._ranks` (the core's rank check at scheduler start) and
:mod:`._lifecycle` (install and uninstall).
"""

from __future__ import annotations

from .. import ENV_ACTIVATE, ENV_CHECK_RANKS, ENV_PREFILL_SWITCH
from .._prefill_switch import PrefillSwitchError
from ._answers import explain, explain_prefill
from ._identity import identify
from ._lifecycle import UnsupportedSglangError, checkpoint, install, is_installed, uninstall
from ._ranks import _check_ranks as _check_ranks  # the tests run the check by hand
from ._ranks import rank_cells

__all__ = [
    "ENV_ACTIVATE",
    "ENV_CHECK_RANKS",
    "ENV_PREFILL_SWITCH",
    "PrefillSwitchError",
    "UnsupportedSglangError",
    "checkpoint",
    "explain",
    "explain_prefill",
    "identify",
    "install",
    "is_installed",
    "rank_cells",
    "uninstall",
]
