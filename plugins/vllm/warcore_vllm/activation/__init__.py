"""warcore active in a vLLM process: each watched module of the installed release checked, then
patched, where vLLM imports it; bound, never replace (vLLM's own guard always runs).

:func:`install` admits a vLLM only if it is exactly an audited release
(:data:`warcore_vllm.releases.RELEASES`, :func:`warcore.integration.releases.pick`) and imports
nothing of vLLM itself: it is what vLLM's ``load_general_plugins()`` calls in every process (the
front end and the engine core too, which never import a model runner's module: importing one
there took them 7 to 25 s). The life cycle is warcore's (:class:`warcore.integration.Activation`):
the watched modules already imported are checked against the release's entry (its functions'
signatures and digests) and given their step now, the others where vLLM imports them; the
activation is *settled* once every one of them passed. A failed check or patch takes the
activation off: everything patched is put back exactly, and vLLM's own guards apply, said once.

What each watched module gets is a step named in the release's entry (:data:`STEPS`): the
release says *which* step a module takes, the steps say *how*.

* ``v1 runner`` (0.33.0): ``GPUModelRunner.synchronize_input_prep`` becomes a wrapper that calls
  vLLM's original every time and, only where the runner has no ``prepare_inputs_event`` while
  ``max_concurrent_batches > 1`` (pipeline parallel without async scheduling, vLLM #47644),
  first synchronizes the device (``GPUModelRunner._sync_device``, vLLM's own coarse option): the
  previous step's copies are done before the host rewrites their sources.
* ``v2 runner`` (both): ``GPUModelRunner.__init__`` and the ``set_default_max_concurrency``
  its module binds, so that the staging ring is as deep as the runner's configuration needs;
  ``GPUModelRunner.execute_model``, so that a step without a forward, and every step of a
  runner whose model state stages in dummy runs, has a release (:mod:`._bounds`: the wrappers
  and the depth rule, beside this module, which holds the life cycle and the steps).
* ``warmups`` (both): each warmup function of :attr:`~warcore_vllm.releases.VllmRelease.
  unsynced_warmups`, so that each of its steps waits for the device first, also where another
  module imported it by name.
* ``check``: the module is checked, and patched by nobody.

The start-up line names what each step changed, and the ring depth of the first runner this
process built (:func:`changes`, :func:`when_runner_built`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from warcore.integration import Activation, UnsupportedRelease
from warcore.integration.engine_code import ShapeMismatch
from warcore.integration.patching import unwrap, wrap

from ..gate import current, installed_version
from ..releases import VllmRelease
from . import _bounds

__all__ = [
    "FALLBACK",
    "STEPS",
    "UnsupportedVllmError",
    "activation",
    "awaits_runner",
    "changes",
    "checked",
    "coarse_syncs",
    "install",
    "is_active",
    "is_installed",
    "release",
    "settled_seconds",
    "skipped",
    "taken_off",
    "uninstall",
    "when_runner_built",
]

logger = logging.getLogger("warcore.vllm")

FALLBACK = "vLLM's own guards apply"


class UnsupportedVllmError(UnsupportedRelease):
    """The installed vLLM is not a release warcore-vllm audited (its version, or its code)."""


def describe_vllm() -> str:
    """``vLLM <version> at <folder> (commit <id>)``: which vLLM this process runs."""
    spec = importlib.util.find_spec("vllm")
    where = os.path.dirname(spec.origin) if spec is not None and spec.origin else "(not importable)"
    module = sys.modules.get("vllm._version")
    commit = getattr(module, "__commit_id__", None) if module is not None else None
    return f"vLLM {installed_version()} at {where} (commit {commit or 'unknown'})"


activation = Activation("warcore-vllm", logger, describe_vllm, FALLBACK)
"""The life cycle: which release is installed, what is patched, settled or taken off."""
_A = activation


@dataclass
class _Said:
    """What the start-up line says of this process's activation (reset at each install)."""

    changes: list[str] = field(default_factory=list)
    """What the steps run so far changed, one phrase each."""
    first_runner: _bounds.RingDepth | None = None
    """The ring depth decided for the first V2 runner this process built."""
    skipped: list[str] = field(default_factory=list)
    """Watched modules this process does not import (the V1 runner's, where it builds a V2
    one)."""
    waiting: list[Callable[[], None]] = field(default_factory=list)
    """Told once, when the first V2 runner is built (the start-up line waits for its depth)."""
    coarse: int = 0
    """Input preparations fenced with the coarse sync."""


_said = _Said()


def _changed(what: str) -> None:
    if what not in _said.changes:
        _said.changes.append(what)


# -- the steps -------------------------------------------------------------------------------


def make_synchronize_input_prep(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """vLLM's ``synchronize_input_prep``, first the coarse sync where the runner overlaps steps
    without its input-prep event (#47644)."""

    @contextlib.contextmanager
    def synchronize_input_prep(self: Any) -> Iterator[None]:
        if self.prepare_inputs_event is None and self.vllm_config.max_concurrent_batches > 1:
            self._sync_device()
            _said.coarse += 1
        with original(self):
            yield

    return wrap(synchronize_input_prep, original)


def _v1_runner(module: ModuleType) -> None:
    cls = module.GPUModelRunner
    patched = make_synchronize_input_prep(vars(cls)["synchronize_input_prep"])
    _A.patcher.set(cls, "synchronize_input_prep", patched)
    _changed(
        "V1 GPUModelRunner.synchronize_input_prep: an overlapped runner without its input-prep "
        "event takes the coarse sync (vLLM #47644)"
    )


def _bound_failed(what: str, exc: Exception) -> None:
    """What warcore added around vLLM's code failed where vLLM runs it: vLLM's own behaviour
    went on; the activation takes itself off, said once."""
    _A.take_off(f"warcore's {what}", f"{type(exc).__name__}: {exc}")


def _in_force() -> VllmRelease:
    entry = release()
    assert entry is not None
    return entry


def _runner_built(runner: Any, depth: _bounds.RingDepth) -> None:
    """A V2 runner is built: this process does not build a V1 one (its module, where the
    release has one, is not waited for), and the start-up line can say the ring's depth."""
    entry = release()
    if entry is None:
        return
    if _said.first_runner is None:
        _said.first_runner = depth
    for module, step in entry.watched.items():
        if step == "v1 runner" and module not in sys.modules and module not in _said.skipped:
            _said.skipped.append(module)
            _A.not_needed(module)
    waiting, _said.waiting = _said.waiting, []
    for callback in waiting:
        callback()


def _v2_runner(module: ModuleType) -> None:
    cls = module.GPUModelRunner
    init = _bounds.make_runner_init(vars(cls)["__init__"], _runner_built)
    _A.patcher.set(cls, "__init__", init)
    name = "set_default_max_concurrency"
    _A.patcher.set(module, name, _bounds.make_set_default_max_concurrency(vars(module)[name]))
    stagers = _in_force().dummy_run_stagers
    _A.patcher.set(
        cls, "execute_model", _bounds.make_execute_model(vars(cls)["execute_model"], stagers)
    )
    _changed("a step that schedules no tokens: a device synchronize after it (it has no release)")
    if stagers:
        names = ", ".join(where.rpartition(":")[2] for where in stagers)
        _changed(
            f"a runner whose model state stages in dummy runs ({names}): each step waits "
            "for the one that last used its slots (an event ring)"
        )


def _warmups(module: ModuleType) -> None:
    entry = _in_force()
    for name in entry.unsynced_warmups:
        original = vars(module)[name]
        patched = _bounds.make_synchronized_warmup(original)
        _A.patcher.set(module, name, patched)
        for binder in entry.warmup_bindings.get(name, ()):
            _rebind(sys.modules.get(binder), name, original, patched)
        _changed(f"{name}: a device synchronize before each of its steps and after the last")


def _rebind(module: ModuleType | None, name: str, original: Any, patched: Any) -> None:
    """A module that imported ``name`` by name before the activation binds ``patched`` too; one
    not imported yet, or still running the import of the patched module (no binding yet),
    binds it from the patched module; a binding of anything else is not the audited code."""
    if module is None:
        return
    bound = vars(module).get(name)
    if bound is None or bound is patched:
        return
    if unwrap(bound) is not original:
        raise ShapeMismatch(f"{module.__name__}.{name}", f"does not bind vLLM's {name}")
    _A.patcher.set(module, name, patched)


def _check(module: ModuleType) -> None:
    """A module checked (its functions as audited) and patched by nobody."""


STEPS: dict[str, Callable[[ModuleType], None]] = {
    "check": _check,
    "v1 runner": _v1_runner,
    "v2 runner": _v2_runner,
    "warmups": _warmups,
}
"""Each step a release's ``watched`` names -> what it does to the module (once the module's
functions passed their checks)."""


# -- install, uninstall ----------------------------------------------------------------------


def install(*, on_settled: Callable[[str | None], None] | None = None) -> None:
    """Check and patch the watched modules imported now, and hook the others' first import
    (idempotent). ``on_settled`` is told once: ``None`` when every watched module is checked
    and patched (before this returns, when they all are imported already), or why the
    activation took itself off. Raises :class:`UnsupportedVllmError` for a vLLM that is not an
    audited release, or whose imported modules fail their checks or their patch (nothing
    stays patched)."""
    global _said
    with _A.lock:
        if _A.installed:
            return
        try:
            entry = current()
        except UnsupportedRelease as exc:
            raise UnsupportedVllmError(str(exc)) from None
        _said = _Said()
        _bounds.on_failure = _bound_failed
        try:
            _A.install(entry, STEPS, on_settled=on_settled)
        except UnsupportedRelease as exc:
            raise UnsupportedVllmError(str(exc)) from None
        except Exception as exc:  # a step failed on a module imported already: nothing stays
            problem = f"patching vLLM {entry.version} failed: {type(exc).__name__}: {exc}"
            raise UnsupportedVllmError(f"{problem}; {FALLBACK}") from None


def uninstall() -> None:
    """Put every attribute the activation patched back, exactly, and remove the hook
    (idempotent)."""
    _A.uninstall()


def is_installed() -> bool:
    """Installed: patched, or waiting for a watched module to be imported."""
    return _A.installed


def is_active() -> bool:
    """Installed and settled: every watched module checked and patched."""
    return _A.installed and _A.settled


def release() -> VllmRelease | None:
    """The entry of the release in force (``None`` when not installed)."""
    entry = _A.release
    return entry if isinstance(entry, VllmRelease) else None


def taken_off() -> str | None:
    """Why the last activation took itself off (``None``: it did not)."""
    return _A.taken_off


def settled_seconds() -> float:
    """What checking and patching the modules vLLM imported after :func:`install` cost."""
    return _A.seconds


DEPTH_RULE = "ring depth: at least uses per step x steps in flight, set as each runner is built"


def changes(*, first_runner: bool = True) -> list[str]:
    """What the activation changed in this process so far, one phrase each: the ring depth of
    the first V2 runner it built (or how it is decided, before one is or without
    ``first_runner``), then each step's."""
    entry = release()
    if _said.first_runner is not None and first_runner:
        return [_said.first_runner.phrase(), *_said.changes]
    if entry is None or "v2 runner" not in entry.watched.values():
        return list(_said.changes)
    if first_runner and _builds_v1(entry):  # a V1 worker: no V2 ring of its own to size
        return list(_said.changes)
    return [DEPTH_RULE, *_said.changes]


def _builds_v1(entry: VllmRelease) -> bool:
    return any(m in sys.modules for m, step in entry.watched.items() if step == "v1 runner")


def awaits_runner() -> bool:
    """The start-up line waits for the first V2 runner's depth: its module is patched, no V2
    runner is built yet, and no V1 runner's module was imported (this process builds a V2
    one, or none)."""
    entry = release()
    if entry is None or _said.first_runner is not None:
        return False
    v2 = [m for m, step in entry.watched.items() if step == "v2 runner"]
    return any(m in sys.modules for m in v2) and not _builds_v1(entry)


def when_runner_built(callback: Callable[[], None]) -> None:
    """``callback()`` once the first V2 runner of this process is built (now, if it is)."""
    if _said.first_runner is not None:
        callback()
    else:
        _said.waiting.append(callback)


def checked() -> list[str]:
    """The watched modules checked (and given their step) in this process: every one, but
    those it does not import (:func:`skipped`)."""
    entry = release()
    return [m for m in entry.watched if m not in _said.skipped] if entry is not None else []


def skipped() -> list[str]:
    """The watched modules this process does not import: the V1 runner's, where it built a V2
    runner."""
    return list(_said.skipped)


def coarse_syncs() -> int:
    """How many input preparations this process fenced with the coarse sync."""
    return _said.coarse
