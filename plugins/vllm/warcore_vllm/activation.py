"""warcore active in a vLLM process: an overlapped V1 runner without its input-prep event
falls back to the coarse sync (bound, never replace: vLLM's own guard always runs).

:func:`install` patches ``GPUModelRunner.synchronize_input_prep`` with a wrapper that calls
vLLM's original every time and, only where the runner has no ``prepare_inputs_event`` while
``max_concurrent_batches > 1`` (pipeline parallel without async scheduling, vLLM #47644),
first synchronizes the device (``GPUModelRunner._sync_device``, vLLM's own coarse option): the
previous step's copies are done before the host rewrites their sources. It refuses a vLLM that
is not exactly the audited release, or whose relied-on bodies differ from the audited digests
(:func:`warcore_vllm._vllm.gate_problems`), and then patches nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["UnsupportedVllmError", "coarse_syncs", "install", "is_installed", "uninstall"]

logger = logging.getLogger("warcore.vllm")

_lock = threading.Lock()
_original: Any = None
_coarse = 0


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not the release warcore-vllm audited (or its shape moved)."""


def coarse_syncs() -> int:
    """How many input preparations this process fenced with the coarse sync."""
    return _coarse


def _make(original: Any) -> Any:
    @contextlib.contextmanager
    def synchronize_input_prep(self: Any) -> Iterator[None]:
        global _coarse
        if self.prepare_inputs_event is None and self.vllm_config.max_concurrent_batches > 1:
            self._sync_device()
            _coarse += 1
        with original(self):
            yield

    synchronize_input_prep.__wrapped_by_warcore__ = original  # type: ignore[attr-defined]
    return synchronize_input_prep


def is_installed() -> bool:
    return _original is not None


def install() -> None:
    """Patch vLLM's V1 runner in this process (idempotent); see the module docstring."""
    global _original
    from ._vllm import gate_problems

    with _lock:
        if _original is not None:
            return
        problems = gate_problems()
        if problems:
            raise UnsupportedVllmError("; ".join(problems))
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        _original = vars(GPUModelRunner)["synchronize_input_prep"]
        GPUModelRunner.synchronize_input_prep = _make(_original)


def uninstall() -> None:
    """Put vLLM's own ``synchronize_input_prep`` back, exactly (idempotent)."""
    global _original
    with _lock:
        if _original is None:
            return
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        GPUModelRunner.synchronize_input_prep = _original
        _original = None
