"""Install and uninstall: the installed release's watched modules, each checked and patched.

:func:`install` admits an sglang release only if it is one warcore-sglang audited, exactly
(:data:`warcore_sglang.releases.RELEASES`), and imports nothing of sglang itself: it is what
sglang's ``load_plugins()`` calls first thing in every server process. The life cycle is
warcore's (:class:`warcore.integration.Activation`): the watched modules already imported are
checked against the release's entry and patched now, the others where sglang imports them; the
activation is *settled* once every one of them passed, at the latest at the end of
``Scheduler.__init__`` (the checkpoint imports a watched module never imported, or names it
when it no longer exists). A failed check or patch takes the activation off: everything is put
back and sglang's own decisions apply, said in one ERROR line.

What each watched module gets is a step named in the release's entry (:data:`STEPS`): the
release says *which* step a module takes (0.5.21 and 0.5.22 decide a prefill publish in a
module function their runners import by name; 0.5.23 in a backend method), the steps say *how*.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from warcore.core import get_plugin_manager
from warcore.integration import UnsupportedRelease, pick
from warcore.integration.engine_code import ShapeMismatch
from warcore.integration.patching import unwrap, wrap

from ..declarations import oracle
from ..declarations.names import SRT
from ..releases import RELEASES, SglangRelease
from ..settings import DEFAULT, prefill_switch_setting, read_prefill_switch
from . import _disagg, _meter, _ranks, _state
from ._owner import make_owner_property
from ._points import (
    make_builder,
    make_prefill_publisher,
    make_record_marker,
    make_resolve_decode,
    make_resolve_prefill,
    make_shared_read_ends,
    make_supports_prefill,
)

logger = logging.getLogger("warcore.sglang")


class UnsupportedSglangError(UnsupportedRelease):
    """The installed sglang is not a release warcore-sglang audited (its version, or its
    code)."""


_A = _state.activation


def _point(make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A declaration point's factory, its product timed when metering (:mod:`._meter`)."""
    state = _state.current
    return _meter.timed(make) if state is not None and state.meter else make


def _worker_gate(cls: type) -> None:
    """A worker class defining ``last_shared_read_runner``: the audited ones are checked; any
    other is bounded all the same (the patched owner never moves sglang's)."""
    if _A.audits(cls):
        _A.check_class(cls)
        return
    _state.log_once(
        ("unaudited-worker", cls),
        logging.INFO,
        f"warcore-sglang: {cls.__module__}.{cls.__qualname__} names its own event owner and "
        "was not audited: the barrier follows it, or is coarse where warcore disagrees",
    )


# -- the steps -------------------------------------------------------------------------------


def _attention_backends(module: ModuleType) -> None:
    backend = module.AttentionBackend
    _A.patcher.patch_tree(backend, "shared_read_ends", _point(make_shared_read_ends))
    _A.patcher.patch_tree(backend, "resolve_prefill_shared_read_ends", _point(make_resolve_prefill))


def _algorithms(module: ModuleType) -> None:
    algo = module.SpeculativeAlgorithm
    original = vars(algo)["supports_prefill_shared_read_done"]
    _A.patcher.set(
        algo, "supports_prefill_shared_read_done", _point(make_supports_prefill)(original)
    )


def _custom_algorithms(module: ModuleType) -> None:
    supports = _point(make_supports_prefill)
    _A.patcher.patch_tree(module.CustomSpecAlgo, "supports_prefill_shared_read_done", supports)


def _decode_runner(module: ModuleType) -> None:
    runner = module.DecodeCudaGraphRunner
    _A.patcher.patch_tree(runner, "_resolve_shared_read_ends", _point(make_resolve_decode))
    _A.patcher.patch_tree(runner, "_record_in_graph_metadata_prep_done", make_record_marker)


def _owners(base: type) -> None:
    owner = _point(make_owner_property)
    _A.patcher.patch_tree(base, "last_shared_read_runner", owner, _worker_gate)


def _tp_worker_owners(module: ModuleType) -> None:
    _owners(module.BaseTpWorker)


def _spec_worker_owners(module: ModuleType) -> None:
    _owners(module.BaseSpecWorker)


def _registry_builder(module: ModuleType) -> None:
    name = "_build_full_attention_backend_from_str"
    _A.patcher.set(module, name, make_builder(vars(module)[name]))


_PUBLISHER = "maybe_publish_prefill_shared_read_done"


def _prefill_publisher(module: ModuleType) -> None:
    patched = _point(make_prefill_publisher)(vars(module)[_PUBLISHER])
    _A.patcher.set(module, _PUBLISHER, patched)


def _prefill_publisher_binding(module: ModuleType) -> None:
    """A module that binds the publisher by name (``from ... import``): the patched object,
    and sglang's own back at uninstall, whether it bound sglang's (imported before the
    publisher's module was patched) or already the patched one (imported after); a binding of
    anything else is not the audited code."""
    source = vars(sys.modules[SRT + "model_executor.runner_utils.shared_read_event"])
    patched, bound = source[_PUBLISHER], vars(module).get(_PUBLISHER)
    original = unwrap(patched)
    if bound is not patched and bound is not original:
        raise ShapeMismatch(f"{module.__name__}.{_PUBLISHER}", "does not bind sglang's publisher")
    _A.patcher.set(module, _PUBLISHER, patched, original=original)


def _scheduler(module: ModuleType) -> None:
    scheduler = module.Scheduler
    _A.patcher.set(scheduler, "__init__", _make_scheduler_init(vars(scheduler)["__init__"]))
    state = _state.current
    if state is not None and state.meter:
        run_batch, barrier = _meter.timed_batches(
            vars(scheduler)["run_batch"],
            vars(scheduler)["_apply_war_barrier"],
            state.meter,
            control=_meter.control(),
        )
        _A.patcher.set(scheduler, "run_batch", run_batch)
        _A.patcher.set(scheduler, "_apply_war_barrier", barrier)


def _check(module: ModuleType) -> None:
    """A module checked and patched by nobody (the mailbox, the environment)."""


def _refused_scheduler(module: ModuleType) -> None:
    scheduler = module.Scheduler
    original = vars(scheduler)["__init__"]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _ranks.check_if_requested(self)

    _A.patcher.set(scheduler, "__init__", wrap(__init__, original))


STEPS: dict[str, Callable[[ModuleType], None]] = {
    "check": _check,
    "attention backends": _attention_backends,
    "algorithms": _algorithms,
    "custom algorithms": _custom_algorithms,
    "decode runner": _decode_runner,
    "tp worker owners": _tp_worker_owners,
    "spec worker owners": _spec_worker_owners,
    "registry builder": _registry_builder,
    "prefill publisher": _prefill_publisher,
    "prefill publisher binding": _prefill_publisher_binding,
    "scheduler": _scheduler,
    "rank check of a refused release": _refused_scheduler,
}
"""Each step a release's ``watched`` names -> what it does to the module (once its checks,
the release's functions and structural checks, passed)."""


def _make_scheduler_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Scheduler.__init__``, then the PD patches of its side, the checkpoint and (when
    asked) the rank check."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _disagg.install(self)
        checkpoint()
        _ranks.check_if_requested(self)

    return wrap(__init__, original)


# -- install, uninstall ----------------------------------------------------------------------


def checkpoint() -> None:
    """Settle now: import each watched module not imported yet (its check and patch run), or
    name the ones that no longer exist and take the activation off."""
    _A.checkpoint()


def is_installed() -> bool:
    return _state.current is not None


def _off() -> None:
    _ranks.set_requested(None)
    state, _state.current = _state.current, None
    if state is not None:
        with contextlib.suppress(ValueError, AttributeError):
            state.pm.remove_change_listener(_state.on_change)
    _state.drop_caches()


def install(
    *, check_ranks: bool | None = None, on_settled: Callable[[str | None], None] | None = None
) -> None:
    """Make sglang's declaration points in this process answer through warcore (idempotent).

    Checks and patches what is imported now and, through a post-import hook, each watched
    module when it is imported later. ``on_settled`` is told once: ``None`` when every watched
    module is checked and patched (at the latest at the end of ``Scheduler.__init__``), or the
    reason the activation took itself off. ``check_ranks`` (default:
    ``WARCORE_SGLANG_CHECK_RANKS``) also runs the rank check at the end of every
    ``Scheduler.__init__``. Raises :class:`UnsupportedSglangError` for an sglang release not
    in :data:`~warcore_sglang.releases.RELEASES` or one whose imported modules fail their
    checks, and :class:`~warcore_sglang.settings.PrefillSwitchError` when
    ``WARCORE_SGLANG_PREFILL_SWITCH`` names no switch (nothing is patched then: sglang runs as
    shipped, its own switch deciding).
    """
    with _state.lock:
        if _state.current is not None:
            return
        try:
            release = _refuse_unsupported()
        except UnsupportedSglangError as exc:
            _join_the_rank_check(check_ranks, str(exc))
            raise
        switch = prefill_switch_setting(os.environ)
        pm = get_plugin_manager()
        _state.current = _state.State(
            release, pm, _state.sglang_plugin_names(pm), switch, meter=_meter.path()
        )
        _state.invalidate()
        pm.add_change_listener(_state.on_change)
        _ranks.set_requested(check_ranks)
        try:
            _A.install(release, STEPS, on_settled=on_settled, on_off=_off)
        except UnsupportedRelease as exc:
            _off()
            raise UnsupportedSglangError(str(exc)) from None
        except BaseException:
            _off()
            raise
    _warn_about_names(_state.current)


def _join_the_rank_check(check_ranks: bool | None, why: str) -> None:
    """A refused release patches nothing of sglang's decisions; where the rank check is asked
    for, its ``Scheduler.__init__`` still ends with the check (this rank's fact: refused, and
    its release), so that every rank refuses naming both releases instead of waiting for this
    one until the check times out."""
    if not _ranks.requested(check_ranks) or _A.installed:
        return
    _ranks.set_requested(check_ranks, why)
    joining = SglangRelease(
        oracle.installed_version() or "unknown",
        functions={},
        watched={SRT + "managers.scheduler": "rank check of a refused release"},
    )
    _A.install(joining, STEPS, on_off=lambda: _ranks.set_requested(None))


def _refuse_unsupported() -> Any:
    try:
        return pick("sglang", oracle.installed_version(), RELEASES, _state.describe_sglang())
    except UnsupportedRelease as exc:
        raise UnsupportedSglangError(f"{exc}; sglang's own barrier decisions apply") from None


def _warn_about_names(state: _state.State | None) -> None:
    if state is None:
        return
    if not state.plugin_names:
        logger.warning(
            "warcore-sglang: warcore's plugin 'sglang' is not loaded (WARCORE_PLUGINS or "
            "WARCORE_DISABLE_PLUGINS?): sglang's own declarations are not among warcore's "
            "answers; each answer stays at least sglang's own for the call"
        )
    if state.prefill_switch != DEFAULT:
        # said at start-up, not at the first prefill; the patched point logs the same line
        # (once: same key) if the variables change later
        envs = getattr(sys.modules.get(SRT + "environ"), "envs", None)
        warning = read_prefill_switch(state.prefill_switch, os.environ, envs).warning
        if warning is not None:
            _state.log_once(("prefill-switch", warning), logging.WARNING, warning)


def uninstall() -> None:
    """Restore every attribute :func:`install` patched (the very objects sglang defined) and
    remove the post-import hook; cached answers are dropped (idempotent)."""
    if _A.uninstall():
        logger.info("warcore-sglang: uninstalled from process %d", os.getpid())
