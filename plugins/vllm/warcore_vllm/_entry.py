"""vLLM's general plugin entry point (group ``vllm.general_plugins``, name ``warcore``).

vLLM's ``load_general_plugins()`` calls :func:`vllm_plugin` once in every vLLM process (the
front end, the engine core, each worker). With ``WARCORE_VLLM=1`` it activates warcore
(:func:`warcore_vllm.activation.install`: it imports nothing of vLLM). Every process says one
start-up line: warcore NOT active (and why: not asked, or an unaudited vLLM, refused), warcore
active (vLLM's runner module was imported already, and is checked and patched), or warcore
*armed*: vLLM's runner module is checked and patched when this process imports it, which only
a process that builds a V1 model runner does. That process then says one more line, when it
happens: warcore active, or taken off (its code differs from the audited one; vLLM's own
guards apply). Never raises: a failing plugin must not take vLLM down.
"""

from __future__ import annotations

import logging
import os
import sys
import time

__all__ = ["ENV_ACTIVATE", "startup_line", "vllm_plugin"]

ENV_ACTIVATE = "WARCORE_VLLM"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}

logger = logging.getLogger("warcore.vllm")


def _who() -> str:
    return f"warcore-vllm: process {os.getpid()}"


def _active_line(took: float) -> str:
    from ._names import SUPPORTED
    from .activation import RUNNER, WATCH

    return (
        f"{_who()}: warcore active (vLLM {SUPPORTED}: {', '.join(WATCH)} checked against the "
        f"audited code, {RUNNER}.GPUModelRunner.synchronize_input_prep patched; warcore's own "
        f"work {took:.3f} s): an overlapped V1 runner without its input-prep event takes the "
        "coarse sync"
    )


def _settled(installed_in: float, reason: str | None) -> None:
    """The activation settled after start-up (vLLM imported its runner module): say so."""
    if reason is not None:
        _emit(logging.ERROR, f"{_who()}: warcore taken off: {reason}")
        return
    from .activation import settled_seconds

    _emit(logging.INFO, _active_line(installed_in + settled_seconds()))


def startup_line() -> tuple[int, str]:
    """Activate if asked; (log level, the start-up line)."""
    flag = os.environ.get(ENV_ACTIVATE, "").strip().lower()
    if flag not in _TRUE:
        level = logging.INFO if flag in _FALSE else logging.WARNING
        return level, f"{_who()}: warcore NOT active: {ENV_ACTIVATE}={flag!r} (set it to 1)"
    start = time.perf_counter()
    took: list[float] = []  # set once install() returned: a later settling is a line of its own

    def on_settled(reason: str | None) -> None:
        if took:
            _settled(took[0], reason)

    try:
        from . import activation

        activation.install(on_settled=on_settled)
    except Exception as exc:
        return logging.ERROR, (
            f"{_who()}: warcore NOT active, vLLM's own guards apply: {type(exc).__name__}: {exc}"
        )
    took.append(time.perf_counter() - start)
    if activation.is_active():  # every watched module was imported already: checked, patched
        return logging.INFO, _active_line(took[0])
    from ._names import SUPPORTED

    return logging.INFO, (
        f"{_who()}: warcore armed in {took[0]:.3f} s (vLLM {SUPPORTED}): "
        f"{activation.RUNNER} is checked and patched when this process imports it (a process "
        "that builds no V1 model runner never does); nothing of vLLM is patched until then"
    )


def _emit(level: int, line: str) -> None:
    """Log the line where logging would show it; otherwise on stderr directly (vLLM configures
    only its own ``vllm`` logger): the line is never lost."""
    if logger.isEnabledFor(level) and (logging.getLogger().handlers or logger.handlers):
        logger.log(level, line)
    else:
        print(f"[{logging.getLevelName(level)}] {line}", file=sys.stderr, flush=True)


def vllm_plugin() -> None:
    """The entry point (see the module docstring)."""
    try:
        level, line = startup_line()
    except Exception as exc:  # never take vLLM's start-up down
        level, line = logging.ERROR, f"warcore-vllm: start-up failed: {type(exc).__name__}: {exc}"
    _emit(level, line)
