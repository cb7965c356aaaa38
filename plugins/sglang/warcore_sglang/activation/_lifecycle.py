"""Install and uninstall: which sglang modules are checked and patched, and when.

:func:`install` refuses an sglang version it has not audited and imports nothing of sglang
itself: it is what sglang's ``load_plugins()`` calls first thing in every server process, before
the runner and backend modules are imported. So it checks and patches the watched modules
already imported and puts a post-import hook at the front of ``sys.meta_path`` for the rest
(:class:`warcore_sglang._post_import.PostImportFinder`). Each watched module passes the shape
gate (:mod:`._shape`) before it is patched. The activation is *settled* once every watched
module is patched: at the latest at the end of ``Scheduler.__init__``, where a watched module
that was never imported is imported (or named, when it no longer exists). A failed check or
patch, wherever it happens, takes the activation off (:func:`_take_off`): every patched
attribute is put back and sglang's own decisions apply, said in one ERROR line.
:func:`uninstall` does the same on request.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from warcore.core import get_plugin_manager

from .. import _sglang
from .._names import AUDITED, SRT
from .._post_import import PostImportFinder
from .._prefill_switch import DEFAULT, prefill_switch_setting, read_prefill_switch
from . import _machinery, _meter, _ranks, _shape, _state
from ._machinery import on_subclasses, patch_tree, set_attr, wrap
from ._owner import make_owner_property
from ._points import (
    make_builder,
    make_record_marker,
    make_resolve_decode,
    make_resolve_prefill,
    make_shared_read_ends,
    make_supports_prefill,
)

logger = logging.getLogger("warcore.sglang")


class UnsupportedSglangError(RuntimeError):
    """The installed sglang is not one warcore-sglang audited (its version, or its code)."""


# -- the gate --------------------------------------------------------------------------------


def _version() -> str:
    state = _state.current
    return state.version if state is not None else ""


def _gate(module: ModuleType) -> None:
    check = _shape.MODULE_CHECKS.get(module.__name__)
    if check is not None:
        check(module)
    _shape.check_audited(module, _version())


def _worker_gate(cls: type) -> None:
    """A worker class defining ``last_shared_read_runner``: the audited ones are checked; any
    other is bounded all the same (the patched owner never moves sglang's)."""
    module = sys.modules[cls.__module__]
    audited = AUDITED[_version()].get(cls.__module__.removeprefix(SRT), {})
    if any(q.startswith(cls.__qualname__ + ".") for q in audited):
        _shape.check_audited(_with_class(module, cls), _version(), owner=cls.__qualname__)
        return
    _state.log_once(
        ("unaudited-worker", cls),
        logging.INFO,
        f"warcore-sglang: {cls.__module__}.{cls.__qualname__} names its own event owner and "
        "was not audited: the barrier follows it, or is coarse where warcore disagrees",
    )


def _with_class(module: ModuleType, cls: type) -> ModuleType:
    """``module`` as it will name ``cls``: a class checked from ``__init_subclass__`` is not
    bound in its module yet (its class statement is still running: sglang's ``create_worker``
    imports the EAGLE v2 worker modules after the scheduler, and each is checked then)."""
    if getattr(module, cls.__qualname__, None) is cls or "." in cls.__qualname__:
        return module
    view = ModuleType(module.__name__)
    vars(view).update(vars(module))
    setattr(view, cls.__qualname__, cls)
    return view


# -- what each watched module gets -----------------------------------------------------------


def _point(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A declaration point's factory, its product timed when metering (:mod:`._meter`)."""
    state = _state.current
    return _meter.timed(make) if state is not None and state.meter else make


def _on_base_backend(module: ModuleType) -> None:
    _gate(module)
    backend = module.AttentionBackend
    patch_tree(backend, "shared_read_ends", _point(make_shared_read_ends))
    patch_tree(backend, "resolve_prefill_shared_read_ends", _point(make_resolve_prefill))


def _on_spec_info(module: ModuleType) -> None:
    _gate(module)
    algo = module.SpeculativeAlgorithm
    original = vars(algo)["supports_prefill_shared_read_done"]
    set_attr(algo, "supports_prefill_shared_read_done", _point(make_supports_prefill)(original))


def _on_spec_registry(module: ModuleType) -> None:
    _gate(module)
    supports = _point(make_supports_prefill)
    patch_tree(module.CustomSpecAlgo, "supports_prefill_shared_read_done", supports)


def _on_decode_runner(module: ModuleType) -> None:
    _gate(module)
    runner = module.DecodeCudaGraphRunner
    on_subclasses(runner, "runner shape", _shape.check_runner_class)
    patch_tree(runner, "_resolve_shared_read_ends", _point(make_resolve_decode))
    patch_tree(runner, "_record_in_graph_metadata_prep_done", make_record_marker)


def _on_spec_worker(module: ModuleType) -> None:
    _gate(module)
    owner = _point(make_owner_property)
    patch_tree(module.BaseSpecWorker, "last_shared_read_runner", owner, _worker_gate)


def _on_tp_worker(module: ModuleType) -> None:
    _gate(module)
    owner = _point(make_owner_property)
    patch_tree(module.BaseTpWorker, "last_shared_read_runner", owner, _worker_gate)


def _on_backend_setup(module: ModuleType) -> None:
    _gate(module)
    name = "_build_full_attention_backend_from_str"
    set_attr(module, name, make_builder(vars(module)[name]))


def _on_scheduler(module: ModuleType) -> None:
    _gate(module)
    scheduler = module.Scheduler
    set_attr(scheduler, "__init__", _make_scheduler_init(vars(scheduler)["__init__"]))
    state = _state.current
    if state is not None and state.meter:
        run_batch, barrier = _meter.timed_batches(
            vars(scheduler)["run_batch"], vars(scheduler)["_apply_war_barrier"], state.meter
        )
        set_attr(scheduler, "run_batch", run_batch)
        set_attr(scheduler, "_apply_war_barrier", barrier)


_WATCH: dict[str, Callable[[ModuleType], None]] = {
    SRT + "layers.attention.base_attn_backend": _on_base_backend,
    SRT + "speculative.spec_info": _on_spec_info,
    SRT + "speculative.spec_registry": _on_spec_registry,
    SRT + "model_executor.runner.decode_cuda_graph_runner": _on_decode_runner,
    SRT + "speculative.base_spec_worker": _on_spec_worker,
    SRT + "managers.tp_worker": _on_tp_worker,
    SRT + "model_executor.model_runner_components.attention_backend_setup": _on_backend_setup,
    SRT + "model_executor.model_runner": _gate,  # the mailbox the owner clears
    SRT + "model_executor.runner_utils.shared_read_event": _gate,  # the prefill publisher
    SRT + "managers.scheduler": _on_scheduler,  # the barrier; the checkpoint
}
"""Every sglang module the activation relies on -> its check-and-patch step."""


# -- settling: every watched module patched, or the activation off ---------------------------


def _make_scheduler_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.__init__``, then the checkpoint and (when asked) the rank check."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        checkpoint()
        _ranks.check_if_requested(self)

    return wrap(__init__, original)


def checkpoint() -> None:
    """Settle now: import each watched module not imported yet (its check and patch run), or
    name the ones that no longer exist and take the activation off."""
    state = _state.current
    if state is None:
        return
    start = time.perf_counter()
    for name in sorted(state.pending):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            _take_off(f"module {name}", "watched, and not in this sglang (moved or renamed?)")
            return
        try:
            importlib.import_module(name)
        except ImportError:  # a GPU build's import: this process never uses its points
            state.pending.discard(name)
        if _state.current is None:
            return  # it failed its check
    state.seconds += time.perf_counter() - start
    _settle_if_done()


def _on_import(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    start = time.perf_counter()
    _machinery.apply(callback, module)
    state = _state.current
    if state is not None:
        state.pending.discard(module.__name__)
        state.seconds += time.perf_counter() - start
        _settle_if_done()


def _settle_if_done() -> None:
    """Settled once no watched module is left unchecked: not the hook's own list, which drops
    a module when its import starts (a watched module importing another would look done
    before its own check ran)."""
    state = _state.current
    if state is None or state.settled or state.pending:
        return
    state.settled = True
    _tell(state, None)


def _tell(state: _state.State, reason: str | None) -> None:
    callback, state.on_settled = state.on_settled, None
    if callback is not None:
        callback(reason)
    elif reason is not None:
        logger.error("warcore-sglang: warcore taken off in process %d: %s", os.getpid(), reason)
    else:
        logger.info(
            "warcore-sglang: active in process %d (sglang %s; every watched module checked and "
            "patched in %.3f s)",
            os.getpid(),
            state.version,
            state.seconds,
        )


def describe_sglang() -> str:
    """``sglang <version> at <folder> (commit <id>)``: which sglang this process runs."""
    version = _sglang.installed_version()
    where = "(not importable)"
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.origin is not None:
        where = os.path.dirname(spec.origin)
    module = sys.modules.get("sglang._version")
    commit = getattr(module, "__commit_id__", None) if module is not None else None
    return f"sglang {version} at {where} (commit {commit or 'unknown'})"


def _off() -> _state.State | None:
    """Put every patched attribute back and drop every cached answer; the state that was on."""
    with _state.lock:
        state = _state.current
        if state is not None:
            _restore(state)
            _state.current = None
            _state.drop_caches()
        return state


def _take_off(check: str, detail: str) -> None:
    """A shape check (or a patch) failed: put everything back; sglang's own decisions apply."""
    state = _off()
    if state is None:
        return
    _state.degraded_check = check
    _tell(state, _differs(state.version, check, detail))


def _differs(version: str, check: str, detail: str) -> str:
    return (
        f"{describe_sglang()} differs from the audited {version} at {check}: {detail}; "
        "sglang's own barrier decisions apply"
    )


def _on_failure(what: str, exc: Exception) -> None:
    if isinstance(exc, _shape.ShapeMismatch):
        _take_off(exc.check, exc.detail)
    else:
        _take_off(f"patching {what}", f"{type(exc).__name__}: {exc}")


# -- install, uninstall ----------------------------------------------------------------------


def is_installed() -> bool:
    return _state.current is not None


def _refuse_unsupported() -> str:
    version = _sglang.installed_version()
    if version is None:
        raise UnsupportedSglangError("sglang is not installed")
    if version not in AUDITED:
        raise UnsupportedSglangError(
            f"{describe_sglang()} is not a version warcore-sglang has audited (audited: "
            f"{', '.join(AUDITED)}, exactly); sglang's own barrier decisions apply"
        )
    return version


def _patch_watched(state: _state.State, watch: dict[str, Callable[[ModuleType], None]]) -> None:
    """Check and patch the watched modules imported already; hook the others' first import."""
    pending = {name: cb for name, cb in watch.items() if name not in sys.modules}
    state.pending = set(pending)
    state.finder = PostImportFinder(
        {name: functools.partial(_on_import, cb) for name, cb in pending.items()}
    )
    sys.meta_path.insert(0, state.finder)
    for name, callback in watch.items():
        module = sys.modules.get(name)
        if module is not None:
            callback(module)


def install(
    *, check_ranks: bool | None = None, on_settled: Callable[[str | None], None] | None = None
) -> None:
    """Make sglang's declaration points in this process answer through warcore (idempotent).

    Checks and patches what is imported now and, through a post-import hook, each watched
    module when it is imported later. ``on_settled`` is told once: ``None`` when every watched
    module is checked and patched (at the latest at the end of ``Scheduler.__init__``), or the
    reason the activation took itself off. ``check_ranks`` (default:
    ``WARCORE_SGLANG_CHECK_RANKS``) also runs the rank check at the end of every
    ``Scheduler.__init__``. Raises :class:`UnsupportedSglangError` for an sglang version not
    in ``warcore_sglang._names.AUDITED`` or one whose imported modules fail the shape gate,
    and :class:`~warcore_sglang._prefill_switch.PrefillSwitchError` when
    ``WARCORE_SGLANG_PREFILL_SWITCH`` names no switch (nothing is patched then: sglang runs as
    shipped, its own switch deciding).
    """
    with _state.lock:
        if _state.current is not None:
            return
        version = _refuse_unsupported()
        switch = prefill_switch_setting(os.environ)
        pm = get_plugin_manager()
        state = _state.State(
            pm=pm,
            plugin_names=_state.sglang_plugin_names(pm),
            prefill_switch=switch,
            version=version,
            on_failure=_on_failure,
            meter=_meter.path(),
        )
        _state.current = state
        _state.degraded_check = None
        _state.invalidate()
        pm.add_change_listener(_state.on_change)
        _ranks.set_requested(check_ranks)
        try:
            _patch_watched(state, dict(_WATCH))
        except Exception as exc:
            _restore(state)
            _state.current = None
            if isinstance(exc, _shape.ShapeMismatch):
                raise UnsupportedSglangError(_differs(version, exc.check, exc.detail)) from None
            raise
        state.on_settled = on_settled
    _warn_about_names(state)
    _settle_if_done()


def _warn_about_names(state: _state.State) -> None:
    if not state.plugin_names:
        logger.warning(
            "warcore-sglang: warcore's plugin 'sglang' is not loaded (WARCORE_PLUGINS or "
            "WARCORE_DISABLE_PLUGINS?): sglang's own declarations are not among warcore's "
            "answers; each answer stays at least sglang's own for the call"
        )
    if state.prefill_switch != DEFAULT:
        # said at start-up, not at the first prefill; the patched resolver logs the same line
        # (once: same key) if the variables change later
        envs = getattr(sys.modules.get(SRT + "environ"), "envs", None)
        warning = read_prefill_switch(state.prefill_switch, os.environ, envs).warning
        if warning is not None:
            _state.log_once(("prefill-switch", warning), logging.WARNING, warning)


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
    if _off() is not None:
        logger.info("warcore-sglang: uninstalled from process %d", os.getpid())
