"""Lazy package exports: a package's public names, imported from their modules on first use.

So that ``import warcore.engine`` (and ``warcore.attention``, ``warcore.runners``) costs nothing
and needs no torch until a name that does is used; ``pip install warcore`` has no torch, and
then the name's first use says so in one line (:func:`torch_missing`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports", "torch_missing"]


def torch_missing(what: str) -> str:
    """The one line that says ``what`` needs the ``engine`` extra."""
    return f"{what} needs torch, which is not installed: pip install 'warcore[engine]'"


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for ``package``: ``exports`` maps each public name to
    the module that defines it, imported when the name is first used."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            value = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ModuleNotFoundError(torch_missing(f"{package}.{name}"), name="torch") from exc
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
