"""A real vLLM method with one guard taken out, put on its class in place (and put back).

The audit's checks are shown to fail when the guard each one checks is removed from vLLM's
real class: the method's own source (``engine_code.definition``) is parsed, one node is changed, and
the result is compiled in the method's own module globals and set on the class for the
duration of a ``with`` block. Everything else of the method is vLLM's. The changed source is
registered with ``linecache`` under the variant's file name, so that ``inspect`` and the
digest of :mod:`warcore.integration.engine_code` read the variant's code, as they read vLLM's.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import itertools
import linecache
from collections.abc import Callable, Iterator
from typing import Any

from warcore.integration import engine_code

__all__ = ["method_source", "replaced", "variant"]


def method_source(cls: type, name: str) -> ast.FunctionDef:
    """The ``def`` of ``cls.name`` as vLLM wrote it (its own class's, not an inherited one)."""
    node = engine_code.definition(vars(cls)[name])
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"{cls.__name__}.{name} is not a plain function")
    return node


_made = itertools.count()


def variant(cls: type, name: str, change: Callable[[ast.FunctionDef], None]) -> Any:
    """``cls.name`` compiled from its source after ``change`` edited its ``def`` in place."""
    original = vars(cls)[name]
    node = method_source(cls, name)
    change(node)
    node.decorator_list = [d for d in node.decorator_list if _keeps(d)]
    text = ast.unparse(ast.fix_missing_locations(node)) + "\n"
    filename = f"<{cls.__name__}.{name} without its guard #{next(_made)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    scope: dict[str, Any] = dict(inspect.unwrap(original).__globals__)
    exec(compile(text, filename, "exec"), scope)
    new: Any = scope[node.name]
    if _is_contextmanager(original):
        new = contextlib.contextmanager(new)
    return new


def _keeps(decorator: ast.expr) -> bool:
    text = ast.unparse(decorator)
    return "contextmanager" not in text


def _is_contextmanager(func: Any) -> bool:
    inner = inspect.unwrap(func)
    return inner is not func and inspect.isgeneratorfunction(inner)


@contextlib.contextmanager
def replaced(cls: type, name: str, value: Any) -> Iterator[None]:
    """``cls.name = value`` for the block, then the original exactly."""
    original = vars(cls)[name]
    setattr(cls, name, value)
    try:
        yield
    finally:
        setattr(cls, name, original)
