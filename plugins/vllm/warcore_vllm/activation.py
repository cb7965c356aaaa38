"""warcore active in a vLLM process: an overlapped V1 runner without its input-prep event
falls back to the coarse sync (bound, never replace: vLLM's own guard always runs).

The patch: ``GPUModelRunner.synchronize_input_prep`` becomes a wrapper that calls vLLM's
original every time and, only where the runner has no ``prepare_inputs_event`` while
``max_concurrent_batches > 1`` (pipeline parallel without async scheduling, vLLM #47644),
first synchronizes the device (``GPUModelRunner._sync_device``, vLLM's own coarse option): the
previous step's copies are done before the host rewrites their sources.

When: :func:`install` refuses a vLLM that is not exactly the audited release and imports
nothing of vLLM itself. It is what vLLM's ``load_general_plugins()`` calls in every process
(the front end and the engine core too, which never import the V1 runner's module: importing it
there took them 7 to 25 s). So it checks (and patches) the watched modules (:data:`WATCH`)
already imported and puts a post-import hook (:class:`warcore.audit.post_import.PostImportFinder`)
at the front of ``sys.meta_path`` for the others: each is checked right after vLLM imports it,
against the audited signatures and digests of its functions (:data:`warcore_vllm._names.AUDITED`),
and patched only once it passed. The activation is *settled* once every watched module is
checked and patched. A failed check or patch takes the activation off (:func:`_take_off`):
everything patched is put back, the hook removed, and vLLM's own guards apply; it never raises
into vLLM's import.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from warcore.audit import engine_code
from warcore.audit.post_import import PostImportFinder

from ._names import AUDITED, SUPPORTED
from ._vllm import unsupported_reason

__all__ = [
    "RUNNER",
    "WATCH",
    "UnsupportedVllmError",
    "coarse_syncs",
    "install",
    "is_active",
    "is_installed",
    "settled_seconds",
    "taken_off",
    "uninstall",
]

logger = logging.getLogger("warcore.vllm")

RUNNER = "vllm.v1.worker.gpu_model_runner"


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not the release warcore-vllm audited (or its code moved)."""


@dataclass
class _State:
    version: str
    on_settled: Callable[[str | None], None] | None
    finder: PostImportFinder | None = None
    unchecked: set[str] = field(default_factory=lambda: set(WATCH))
    """Watched modules not checked (and patched) yet: a module's hook is spent when vLLM
    starts importing it, and that module may import another watched one before it is done."""
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    """Spent checking and patching the modules vLLM imported after :func:`install` (not
    vLLM's own import of them)."""
    settled: bool = False


_lock = threading.RLock()
_state: _State | None = None
_taken_off: str | None = None
_coarse = 0


def coarse_syncs() -> int:
    """How many input preparations this process fenced with the coarse sync."""
    return _coarse


def is_installed() -> bool:
    """Installed: patched, or waiting for a watched module to be imported."""
    return _state is not None


def is_active() -> bool:
    """Installed and settled: every watched module checked and patched."""
    return _state is not None and _state.settled


def taken_off() -> str | None:
    """Why the last activation took itself off (``None``: it did not)."""
    return _taken_off


# -- what each watched module gets -----------------------------------------------------------


def _check(module: ModuleType) -> None:
    assert _state is not None
    engine_code.check_functions(module, AUDITED[_state.version][module.__name__], _state.version)


def _make(original: Any) -> Any:
    @contextlib.contextmanager
    def synchronize_input_prep(self: Any) -> Iterator[None]:
        global _coarse
        if self.prepare_inputs_event is None and self.vllm_config.max_concurrent_batches > 1:
            self._sync_device()
            _coarse += 1
        with original(self):
            yield

    synchronize_input_prep.__warcore_original__ = original  # type: ignore[attr-defined]
    return synchronize_input_prep


def _on_runner(module: ModuleType) -> None:
    _check(module)
    cls = module.GPUModelRunner
    original = vars(cls)["synchronize_input_prep"]
    assert _state is not None
    _state.patches.append((cls, "synchronize_input_prep", original))
    cls.synchronize_input_prep = _make(original)


WATCH: dict[str, Callable[[ModuleType], None]] = {
    RUNNER: _on_runner,  # the guard, patched
    "vllm.config.vllm": _check,  # VllmConfig.max_concurrent_batches
    "vllm.v1.utils": _check,  # CpuGpuBuffer.copy_to_gpu: the copies the event guards
}
"""Every vLLM module the activation relies on -> its check-and-patch step (the audit's other
modules, the V2 runner's, the encoder runner's and the scheduler's, are checked by the audit,
:func:`warcore_vllm._vllm.gate_problems`, and patched by nobody)."""


# -- settling, taking off --------------------------------------------------------------------


def _on_import(step: Callable[[ModuleType], None], module: ModuleType) -> None:
    """A watched module was just imported by vLLM: check and patch it; never raises."""
    start = time.perf_counter()
    with _lock:
        state = _state
        if state is None:
            return
        try:
            step(module)
        except Exception as exc:
            _take_off(module.__name__, exc)
            return
        state.unchecked.discard(module.__name__)
        state.seconds += time.perf_counter() - start
        _settle_if_done(state)


def _settle_if_done(state: _State) -> None:
    if state.settled or state.unchecked:
        return
    state.settled = True
    _remove_finder(state)
    _tell(state, None)


def _tell(state: _State, reason: str | None) -> None:
    callback, state.on_settled = state.on_settled, None
    if callback is not None:
        callback(reason)
    elif reason is not None:
        logger.error("warcore-vllm: warcore taken off in process %d: %s", os.getpid(), reason)


def _reason(state: _State, where: str, exc: Exception) -> str:
    if isinstance(exc, engine_code.ShapeMismatch):
        problem = f"{where} differs from the audited {state.version} at {exc.check}: {exc.detail}"
    else:
        problem = f"patching {where} failed: {type(exc).__name__}: {exc}"
    return f"{problem}; vLLM's own guards apply"


def _take_off(where: str, exc: Exception) -> None:
    global _state, _taken_off
    state = _state
    if state is None:
        return
    _restore(state)
    _state = None
    _taken_off = _reason(state, where, exc)
    _tell(state, _taken_off)


def _remove_finder(state: _State) -> None:
    if state.finder is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(state.finder)
        state.finder = None


def _restore(state: _State) -> None:
    _remove_finder(state)
    for owner, attr, original in reversed(state.patches):
        setattr(owner, attr, original)
    state.patches.clear()


# -- install, uninstall ----------------------------------------------------------------------


def install(*, on_settled: Callable[[str | None], None] | None = None) -> None:
    """Check and patch the watched modules imported now, and hook the others' first import
    (idempotent). ``on_settled`` is told once: ``None`` when every watched module is checked
    and patched (before this returns, when they all are imported already), or why the
    activation took itself off. Raises :class:`UnsupportedVllmError` for a vLLM that is not
    the audited release or whose imported modules fail their check (nothing stays patched)."""
    global _state, _taken_off
    with _lock:
        if _state is not None:
            return
        reason = unsupported_reason()
        if reason is not None:
            raise UnsupportedVllmError(reason)
        state = _State(SUPPORTED, on_settled)
        _state, _taken_off = state, None
        pending = {name: step for name, step in WATCH.items() if name not in sys.modules}
        state.finder = PostImportFinder(
            {name: functools.partial(_on_import, step) for name, step in pending.items()}
        )
        sys.meta_path.insert(0, state.finder)
        try:
            for name, step in WATCH.items():
                if name not in pending:
                    step(sys.modules[name])
                    state.unchecked.discard(name)
        except Exception as exc:
            _restore(state)
            _state = None
            raise UnsupportedVllmError(_reason(state, name, exc)) from None
        _settle_if_done(state)


def uninstall() -> None:
    """Put vLLM's own ``synchronize_input_prep`` back, exactly, and remove the hook
    (idempotent)."""
    global _state
    with _lock:
        if _state is not None:
            _restore(_state)
            _state = None


def settled_seconds() -> float:
    """What checking and patching the modules vLLM imported after :func:`install` cost."""
    return _state.seconds if _state is not None else 0.0
