"""vLLM's general plugin entry point (group ``vllm.general_plugins``, name ``warcore``).

vLLM's ``load_general_plugins()`` calls :func:`vllm_plugin` once in every vLLM process (the
front end, the engine core, each worker). With ``WARCORE_VLLM=1`` it activates warcore
(:func:`warcore_vllm.activation.install`); in every case it logs one start-up line saying
whether warcore is active in this process, or why not (an unaudited vLLM is refused in that
line and runs as shipped). Never raises: a failing plugin must not take vLLM down.
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


def startup_line() -> tuple[int, str]:
    """Activate if asked; (log level, the line)."""
    who = f"warcore-vllm: process {os.getpid()}"
    flag = os.environ.get(ENV_ACTIVATE, "").strip().lower()
    if flag not in _TRUE:
        level = logging.INFO if flag in _FALSE else logging.WARNING
        return level, f"{who}: warcore NOT active: {ENV_ACTIVATE}={flag!r} (set it to 1)"
    start = time.perf_counter()
    try:
        from . import activation

        activation.install()
    except Exception as exc:
        return logging.ERROR, (
            f"{who}: warcore NOT active, vLLM's own guards apply: {type(exc).__name__}: {exc}"
        )
    took = time.perf_counter() - start
    from ._vllm import installed_version

    return logging.INFO, (
        f"{who}: warcore active in {took:.3f} s (vLLM {installed_version()}: an overlapped V1 "
        "runner without its input-prep event takes the coarse sync)"
    )


def vllm_plugin() -> None:
    """The entry point (see the module docstring)."""
    try:
        level, line = startup_line()
    except Exception as exc:  # never take vLLM's start-up down
        level, line = logging.ERROR, f"warcore-vllm: start-up failed: {type(exc).__name__}: {exc}"
    if logger.isEnabledFor(level) and (logging.getLogger().handlers or logger.handlers):
        logger.log(level, line)
    else:
        print(f"[{logging.getLevelName(level)}] {line}", file=sys.stderr, flush=True)
