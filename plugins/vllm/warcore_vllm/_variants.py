"""A real vLLM method with one guard taken out, put on its class in place (and put back).

The audit's checks are shown to fail when the guard each one checks is removed from vLLM's
real class: the method's own source (``inspect.getsource``) is parsed, one node is changed, and
the result is compiled in the method's own module globals and set on the class for the
duration of a ``with`` block. Everything else of the method is vLLM's.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["method_source", "replaced", "variant"]


def method_source(cls: type, name: str) -> ast.FunctionDef:
    """The ``def`` of ``cls.name`` as vLLM wrote it (its own class's, not an inherited one)."""
    func = inspect.unwrap(vars(cls)[name])
    edited = getattr(vars(cls)[name], "__warcore_ast__", getattr(func, "__warcore_ast__", None))
    if edited is not None:  # a variant made here: its source is the edited tree
        return copy.deepcopy(edited)  # type: ignore[no-any-return]
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"{cls.__name__}.{name} is not a plain function")
    return node


def variant(cls: type, name: str, change: Callable[[ast.FunctionDef], None]) -> Any:
    """``cls.name`` compiled from its source after ``change`` edited its ``def`` in place."""
    original = vars(cls)[name]
    node = method_source(cls, name)
    change(node)
    node.decorator_list = [d for d in node.decorator_list if _keeps(d)]
    module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
    func = inspect.unwrap(original)
    scope: dict[str, Any] = dict(func.__globals__)
    exec(compile(module, f"<{cls.__name__}.{name} without its guard>", "exec"), scope)
    new: Any = scope[node.name]
    new.__warcore_ast__ = copy.deepcopy(node)
    if _is_contextmanager(original):
        new = contextlib.contextmanager(new)
        new.__warcore_ast__ = copy.deepcopy(node)
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
