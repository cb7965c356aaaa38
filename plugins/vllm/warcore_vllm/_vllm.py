"""The installed vLLM: its version, compared exactly, and the shape of what warcore-vllm relies
on (each function of :data:`~warcore_vllm._names.RELIES_ON` present, with the AST digest of its
body audited for that version)."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.metadata as md
import inspect
import textwrap
from typing import Any

from ._names import AUDITED, RELIES_ON, SUPPORTED

__all__ = ["digest", "digests", "gate_problems", "installed_version", "unsupported_reason"]


def installed_version() -> str | None:
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def unsupported_reason(version: str | None = None) -> str | None:
    """``None`` when ``version`` (default: the installed one) is exactly :data:`SUPPORTED`."""
    version = installed_version() if version is None else version
    if version is None:
        return "vLLM is not installed"
    if version != SUPPORTED:
        return f"vLLM {version} is installed; warcore-vllm was audited against {SUPPORTED} only"
    return None


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = vars(obj)[part] if isinstance(obj, type) else getattr(obj, part)
    if isinstance(obj, property):
        obj = obj.fget
    return inspect.unwrap(obj)


def digest(func: Any) -> str:
    """sha256 of the function's AST (``ast.dump``: comments and formatting do not count)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def digests() -> dict[str, str]:
    """The installed vLLM's digest of every function warcore-vllm relies on."""
    return {name: digest(_resolve(module, name)) for module, name in RELIES_ON}


def gate_problems() -> list[str]:
    """Why warcore-vllm must not act on the installed vLLM (empty: it may)."""
    reason = unsupported_reason()
    if reason is not None:
        return [reason]
    audited = AUDITED[SUPPORTED]
    problems: list[str] = []
    for module, name in RELIES_ON:
        try:
            found = digest(_resolve(module, name))
        except Exception as exc:  # moved, renamed, no source: not what was audited
            problems.append(f"{module}.{name}: {type(exc).__name__}: {exc}")
            continue
        if found != audited.get(name):
            problems.append(f"{module}.{name}: body digest {found}, audited {audited.get(name)}")
    return problems
