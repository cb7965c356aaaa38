"""Activation: make a running sglang 0.5.23 process consult warcore, never earlier than sglang.

:func:`install` patches sglang's declaration points in this process so that installed warcore
plugins, vetoes and force-coarse act on sglang's real runners. Every patched point calls
sglang's own code first, with the arguments as given, and answers no earlier than it
(*bound, never replace*):

=====================================================  =====================================
patched (sglang 0.5.23)                                answers
=====================================================  =====================================
``shared_read_ends`` of ``AttentionBackend`` and of    the later of sglang's own answer and
every subclass defining its own (also classes         warcore's resolution for the backend's
defined later: ``AttentionBackend.__init_subclass__``) warcore name; a veto, force-coarse or
                                                       a non-publishing phase: UNKNOWN
``resolve_prefill_shared_read_ends`` (and overrides)   sglang's own (its switches, gates and
                                                       per-batch snapshot), bounded by
                                                       warcore's prefill decision
``SpeculativeAlgorithm`` / ``CustomSpecAlgo``          sglang's own "no" stays no; a "yes"
``.supports_prefill_shared_read_done``                 is warcore's publish phase for EXTEND
``last_shared_read_runner`` of ``BaseTpWorker``,       the runner sglang's worker names for
``BaseSpecWorker`` and each worker defining it         this step, if warcore's event owner
                                                       names the same; otherwise a runner
                                                       with no event (a coarse barrier)
``DecodeCudaGraphRunner._resolve_shared_read_ends``    the later of sglang's own and the
(and overrides)                                        backend's patched answer, remembered
                                                       per runner (one attribute read, one
                                                       dict lookup per replay)
=====================================================  =====================================

Plus small wraps: ``_record_in_graph_metadata_prep_done`` forgets a runner's remembered
answers when it plants its in-graph event; ``attention_backend_setup.
_build_full_attention_backend_from_str`` tags each backend sglang's registry builds with its
warcore name (``fa3`` and ``fa4`` build one class); ``Scheduler.__init__`` ends with the
checkpoint and, with ``WARCORE_SGLANG_CHECK_RANKS``, the rank check
(:func:`warcore.audit.ranks.check_ranks_agree` over sglang's world CPU group).

Only an audited sglang is patched: its version exactly (``warcore_sglang._names.AUDITED``),
and each watched module's shape (:mod:`._shape`: signatures, members, globals, variables and
the digests of the bodies warcore wraps or relies on), checked where the module is patched. A
refused version or a failed check patches nothing (or puts everything back): sglang's own
decisions apply, said in one ERROR start-up line.

Modules not imported yet are checked and patched when they are imported (a post-import hook on
``sys.meta_path``), so :func:`install` imports nothing of sglang itself: it is what sglang's
``load_plugins()`` calls (entry point ``sglang.srt.plugins``: ``warcore``) first thing in
every server process when ``WARCORE_SGLANG=1`` (through :mod:`warcore_sglang._entry`, which
activates only where a model runner may be built). :func:`uninstall` removes the hook and
restores every patched attribute exactly (the same objects; an attribute that was inherited is
deleted again).

The package, read top-down (each module imports only those below it): :mod:`._lifecycle`
(install, uninstall, the watched modules, the checkpoint), :mod:`._points` and :mod:`._owner`
(the patched methods and property: sglang's own answer, warcore's, the bound), :mod:`._answers`
(warcore's answer for an instance, bounded, with its provenance), :mod:`._identity` (a live
backend's warcore name and context), :mod:`._shape` (the gate), :mod:`._ranks` (the rank check),
:mod:`._meter` (the opt-in per-batch timing), :mod:`._machinery` (patching that can be put back
exactly) and :mod:`._state` (the installed state, the generation every cache is keyed by).
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
