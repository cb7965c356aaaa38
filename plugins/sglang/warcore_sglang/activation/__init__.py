"""Activation: make a running sglang process consult warcore, never earlier than sglang.

:func:`install` patches the declaration points of the installed sglang release (one of
:data:`warcore_sglang.releases.RELEASES`, exactly) in this process so that installed warcore
plugins, vetoes and force-coarse act on sglang's real runners. Every patched point calls that
release's own code first, with the arguments as given, and answers no earlier than it
(*bound, never replace*):

=====================================================  =====================================
patched                                                answers
=====================================================  =====================================
``shared_read_ends`` of ``AttentionBackend`` and of    the later of sglang's own answer for
every subclass defining its own (also classes          the call and warcore's for the
defined later: ``AttentionBackend.__init_subclass__``) backend's warcore name; a veto,
                                                       force-coarse or a non-publishing
                                                       phase: UNKNOWN
0.5.23: ``resolve_prefill_shared_read_ends`` (and      sglang's own (its switches, gates and
overrides); 0.5.21, 0.5.22: the module function        per-batch snapshot or declaration),
``maybe_publish_prefill_shared_read_done``, wherever   bounded by warcore's prefill decision;
it is bound by name                                    an event published against it is
                                                       taken back (a coarse barrier)
``SpeculativeAlgorithm`` / ``CustomSpecAlgo``          sglang's own "no" stays no; a "yes"
``.supports_prefill_shared_read_done``                 is warcore's publish phase for EXTEND
``last_shared_read_runner`` of ``BaseTpWorker``,       the runner sglang's worker names for
``BaseSpecWorker`` and each worker defining it         this step, if warcore's event owner
                                                       names the same and that runner
                                                       publishes through patched points only;
                                                       otherwise a runner with no event (a
                                                       coarse barrier)
``DecodeCudaGraphRunner._resolve_shared_read_ends``    the later of sglang's own and
(and overrides)                                        warcore's (an IN_REPLAY without the
                                                       in-graph marker: POST_REPLAY),
                                                       remembered per runner (one attribute
                                                       read, one dict lookup per replay)
=====================================================  =====================================

Plus small wraps: ``_record_in_graph_metadata_prep_done`` forgets a runner's remembered
answers when it plants its in-graph event; ``attention_backend_setup.
_build_full_attention_backend_from_str`` tags each backend sglang's registry builds with its
warcore name (``fa3`` and ``fa4`` build one class); ``Scheduler.__init__`` ends with the
checkpoint and, with ``WARCORE_SGLANG_CHECK_RANKS``, the rank check
(:func:`warcore.audit.ranks.check_ranks_agree` over sglang's world CPU group).

Only an audited release is patched, and only where each watched module is as its entry says
(its relied-on functions' signatures and digests, its structural checks), checked where the
module is imported: a refused release or a failed check patches nothing (or puts everything
back): sglang's own decisions apply, said in one ERROR start-up line. :func:`uninstall`
restores every patched attribute exactly.

The package, read top-down (each module imports only those below it): :mod:`._lifecycle`
(install, uninstall, the steps each watched module gets), :mod:`._points` and :mod:`._owner`
(the patched methods and property), :mod:`._answers` (warcore's answer for an instance, the
bound, the provenance), :mod:`._identity` (a live backend's warcore name and context),
:mod:`._ranks` (the rank check), :mod:`._meter` (the opt-in per-batch timing) and
:mod:`._state` (the installed state and the one cache).
"""

from __future__ import annotations

from ._answers import explain, explain_prefill
from ._identity import identify
from ._lifecycle import (
    STEPS,
    UnsupportedSglangError,
    checkpoint,
    install,
    is_installed,
    uninstall,
)
from ._ranks import _check_ranks as _check_ranks  # the tests run the check by hand
from ._ranks import rank_cells

__all__ = [
    "STEPS",
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
