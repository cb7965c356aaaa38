"""Install and uninstall: which sglang modules are patched, and when.

:func:`install` imports nothing of sglang itself: it is what sglang's ``load_plugins()`` calls
first thing in every server process, before the runner and backend modules are imported. So it
patches the watched modules already imported and puts a post-import hook at the front of
``sys.meta_path`` for the rest (:class:`warcore_sglang._post_import.PostImportFinder`).
:func:`uninstall` removes the hook, restores every patched attribute exactly and takes the
per-instance caches off the objects that hold them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType

from warcore.core import get_plugin_manager

from .. import _sglang
from .._names import SRT
from .._post_import import PostImportFinder
from .._prefill_switch import DEFAULT, prefill_switch_setting, read_prefill_switch
from . import _machinery, _ranks, _state
from ._machinery import patch_tree, set_attr
from ._owner import make_owner_property
from ._points import (
    make_builder,
    make_resolve_decode,
    make_resolve_prefill,
    make_shared_read_ends,
    make_supports_prefill,
)

logger = logging.getLogger("warcore.sglang")


class UnsupportedSglangError(RuntimeError):
    """The installed sglang is outside the range warcore-sglang was read from and tested on."""


def _on_base_backend(module: ModuleType) -> None:
    backend = module.AttentionBackend
    patch_tree(backend, "shared_read_ends", make_shared_read_ends)
    set_attr(
        backend,
        "resolve_prefill_shared_read_ends",
        make_resolve_prefill(vars(backend)["resolve_prefill_shared_read_ends"]),
    )


def _on_spec_info(module: ModuleType) -> None:
    algo = module.SpeculativeAlgorithm
    set_attr(
        algo,
        "supports_prefill_shared_read_done",
        make_supports_prefill(vars(algo)["supports_prefill_shared_read_done"]),
    )


def _on_spec_registry(module: ModuleType) -> None:
    patch_tree(module.CustomSpecAlgo, "supports_prefill_shared_read_done", make_supports_prefill)


def _on_decode_runner(module: ModuleType) -> None:
    patch_tree(module.DecodeCudaGraphRunner, "_resolve_shared_read_ends", make_resolve_decode)


def _on_spec_worker(module: ModuleType) -> None:
    patch_tree(module.BaseSpecWorker, "last_shared_read_runner", make_owner_property)


def _on_tp_worker(module: ModuleType) -> None:
    patch_tree(module.BaseTpWorker, "last_shared_read_runner", make_owner_property)


def _on_backend_setup(module: ModuleType) -> None:
    name = "_build_full_attention_backend_from_str"
    set_attr(module, name, make_builder(vars(module)[name]))


def _on_scheduler(module: ModuleType) -> None:
    scheduler = module.Scheduler
    set_attr(scheduler, "__init__", _ranks.make_scheduler_init(vars(scheduler)["__init__"]))


_WATCH: dict[str, Callable[[ModuleType], None]] = {
    SRT + "layers.attention.base_attn_backend": _on_base_backend,
    SRT + "speculative.spec_info": _on_spec_info,
    SRT + "speculative.spec_registry": _on_spec_registry,
    SRT + "model_executor.runner.decode_cuda_graph_runner": _on_decode_runner,
    SRT + "speculative.base_spec_worker": _on_spec_worker,
    SRT + "managers.tp_worker": _on_tp_worker,
    SRT + "model_executor.model_runner_components.attention_backend_setup": _on_backend_setup,
}
_SCHEDULER = SRT + "managers.scheduler"


def is_installed() -> bool:
    return _state.current is not None


def _refuse_unsupported() -> None:
    reason = _sglang.unsupported_reason()
    if reason is not None:
        raise UnsupportedSglangError(
            f"warcore-sglang will not patch this sglang: {reason} (its declarations were "
            "read from that release's code; another release may declare differently)"
        )


def _patch_watched(state: _state.State, watch: dict[str, Callable[[ModuleType], None]]) -> None:
    """Patch the watched modules imported already; hook the others' first import."""
    pending = {name: cb for name, cb in watch.items() if name not in sys.modules}
    state.finder = PostImportFinder(
        {name: functools.partial(_machinery.apply, cb) for name, cb in pending.items()}
    )
    sys.meta_path.insert(0, state.finder)
    for name, callback in watch.items():
        module = sys.modules.get(name)
        if module is not None:
            callback(module)


def install(*, check_ranks: bool | None = None) -> None:
    """Make sglang's declaration points in this process answer through warcore (idempotent).

    Patches what is imported now and, through a post-import hook, each watched module when it
    is imported later. ``check_ranks`` (default: ``WARCORE_SGLANG_CHECK_RANKS``) also runs the
    rank check at the end of every ``Scheduler.__init__``. Raises
    :class:`UnsupportedSglangError` when the installed sglang is outside
    ``warcore_sglang.SUPPORTED``, and :class:`~warcore_sglang._prefill_switch.PrefillSwitchError`
    when ``WARCORE_SGLANG_PREFILL_SWITCH`` names no switch (nothing is patched either way: sglang
    then runs as shipped, its own switch deciding; warcore-sglang never guesses which switch an
    operator meant).
    """
    with _state.lock:
        if _state.current is not None:
            return
        _refuse_unsupported()
        switch = prefill_switch_setting(os.environ)
        pm = get_plugin_manager()
        state = _state.State(
            pm=pm, plugin_names=_state.sglang_plugin_names(pm), prefill_switch=switch
        )
        _state.current = state
        _state.invalidate()
        pm.add_change_listener(_state.on_change)
        if not state.plugin_names:
            logger.warning(
                "warcore-sglang: warcore's plugin 'sglang' is not loaded (WARCORE_PLUGINS or "
                "WARCORE_DISABLE_PLUGINS?): sglang's own declarations are not among warcore's "
                "answers; each answer stays at least sglang's own for the instance"
            )
        watch = dict(_WATCH)
        if check_ranks if check_ranks is not None else _ranks.requested():
            watch[_SCHEDULER] = _on_scheduler
        try:
            _patch_watched(state, watch)
        except Exception:
            _restore(state)
            _state.current = None
            raise
    if switch != DEFAULT:
        # said at start-up, not at the first prefill; the patched resolver logs the same line
        # (once: same key) if the variables change later
        envs = getattr(sys.modules.get(SRT + "environ"), "envs", None)
        warning = read_prefill_switch(switch, os.environ, envs).warning
        if warning is not None:
            _state.log_once(("prefill-switch", warning), logging.WARNING, warning)
    logger.info(
        "warcore-sglang: active in process %d (sglang %s; warcore resolves its declaration "
        "points; prefill switch: %s)",
        os.getpid(),
        _sglang.installed_version(),
        switch,
    )


def _restore(state: _state.State) -> None:
    if state.finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(state.finder)
    _machinery.restore(state.patches)
    with contextlib.suppress(ValueError, AttributeError):
        state.pm.remove_change_listener(_state.on_change)


def uninstall() -> None:
    """Restore every attribute :func:`install` patched (the very objects sglang defined) and
    remove the post-import hook; cached answers are dropped (idempotent)."""
    with _state.lock:
        state = _state.current
        if state is None:
            return
        _restore(state)
        _state.current = None
        _state.invalidate()
        for holder in list(_state.CACHED):
            for key in (_state.SRE, _state.PREFILL, _state.LAST):
                holder.__dict__.pop(key, None)
        _state.CACHED.clear()
    logger.info("warcore-sglang: uninstalled from process %d", os.getpid())


def sglang_plugin() -> None:
    """sglang's plugin entry point (group ``sglang.srt.plugins``): activate when
    ``WARCORE_SGLANG=1``, and log the process's start-up line. Never raises. The entry point
    itself is :func:`warcore_sglang._entry.sglang_plugin` (it imports no ``warcore`` before it
    knows whether the package is shadowed); this name stays for callers of 0.1.0."""
    from .._entry import sglang_plugin as entry

    entry()
