"""What an engine module's source says, read without importing it: the names it binds at run
time, its classes and what each binds, what its imports name.

``warcore release`` reads a release from its wheel with these: the structural checks'
:meth:`~warcore.integration.checks.Check.in_source` and the wheel's source index
(:class:`~warcore.integration.wheel.SourceTree`) are built on them.

Read from the syntax tree, so they see what the code says, not what running it does. What that
approximates, the safe side noted where there is one:

* a module's run-time names are those its top-level statements bind, in every branch of an
  ``if``/``try``/``with``/``for`` except the body of ``if TYPE_CHECKING:`` (so a name bound
  only on another platform's branch counts as bound); a name bound by ``globals()[...]``,
  ``setattr`` on the module or a module ``__getattr__`` is not seen;
* a name bound more than once is taken where it is last bound, as Python binds it (a method
  defined twice: the second ``def``), except across alternatives: of an ``if``'s branches
  the first that binds it, of a ``try`` its body before its handlers (the import that
  normally runs, not its fallback); a ``finally`` or a later statement binds over both;
* a class's names are those its body binds (methods, assignments, nested classes), never what
  a metaclass, a decorator or ``setattr`` adds;
* an enum member is a body assignment of a value (not a function, a descriptor or a
  ``_sunder_``/``__dunder__`` name), numbered as ``auto()`` numbers them (the last integer
  plus one, from 1); a value that is not a literal is its source text.

Standard library only.
"""

from __future__ import annotations

import ast
import itertools
import re
import textwrap
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "Binding",
    "bindings",
    "class_members",
    "classes",
    "dotted",
    "enum_members",
    "find_class",
    "instance_attributes",
    "parse",
    "star_imports",
    "tokens",
]

_Function = (ast.FunctionDef, ast.AsyncFunctionDef)
_ACCESSORS = frozenset({"setter", "deleter", "getter"})
_DESCRIPTORS = frozenset({"property", "staticmethod", "classmethod", "cached_property"})


MAX_CACHED_TOKENS = 1_000_000
"""The tokens (:func:`tokens`) of the syntax trees :func:`parse` keeps, the least recently
used dropped first. A tree takes 500 to 900 bytes per token (measured: 510 for real modules
and dense lists, 920 for a module of bare names), so they hold at most about 0.9 GB; the
largest module of the audited releases has 48,000."""

_TOKEN = re.compile(r"\w+|[^\w \t\r\f\v]")
_trees: OrderedDict[str, tuple[ast.Module, int]] = OrderedDict()


def tokens(source: str, most: int) -> int:
    """About how many tokens ``source`` holds (each name or number, each other character
    that is not a space, each line end: no fewer than the syntax tree's nodes), counted up to
    ``most + 1`` at most."""
    return sum(1 for _ in itertools.islice(_TOKEN.finditer(source), most + 1))


def parse(source: str) -> ast.Module:
    """``source``'s syntax tree (kept, within :data:`MAX_CACHED_TOKENS`, for the modules read
    again: each check of a module and the subclass search parse it once). Raises
    :class:`SyntaxError`."""
    found = _trees.get(source)
    if found is not None:
        _trees.move_to_end(source)
        return found[0]
    tree = ast.parse(source)
    _trees[source] = (tree, tokens(source, MAX_CACHED_TOKENS))
    kept = sum(count for _, count in _trees.values())
    while kept > MAX_CACHED_TOKENS:
        _, (_, count) = _trees.popitem(last=False)
        kept -= count
    return tree


def _is_type_checking(test: ast.expr) -> bool:
    return dotted(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def runtime_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of ``body`` and of the blocks nested in it that run at import (both
    branches of an ``if``, a ``try`` with its handlers, ``with``, ``for``, ``while``), the
    body of ``if TYPE_CHECKING:`` left out. Functions and classes are yielded, not entered."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from runtime_statements(node.body)
            yield from runtime_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse):
                yield from runtime_statements(block)
            yield from runtime_statements(node.finalbody)
        elif isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)):
            yield from runtime_statements(node.body)
            if not isinstance(node, (ast.With, ast.AsyncWith)):
                yield from runtime_statements(node.orelse)


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a name or an attribute chain on a name (a subscript's value: the class
    of ``Base[T]``); ``None`` for anything else."""
    if isinstance(node, ast.Subscript):
        return dotted(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


@dataclass(frozen=True)
class Binding:
    """How a module (or a class body) binds one name.

    ``kind``: ``class``, ``function``, ``value`` (an assignment: ``node`` is its value, or
    ``None`` for a target such as a ``for`` loop's), ``module`` (``import a.b as x``:
    ``target`` the module) or ``from`` (``from a import b``: ``target`` ``a``, ``name`` ``b``;
    relative imports already resolved)."""

    kind: str
    node: ast.AST | None = None
    target: str = ""
    name: str = ""


def _targets(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The module ``from <level dots><name> import ...`` names, in ``module``."""
    if not level:
        return name or ""
    parts = module.split(".")
    base = parts[: len(parts) - level + (1 if is_package else 0)]
    return ".".join([*base, name] if name else base)


def _statement_bindings(
    node: ast.stmt, module: str, is_package: bool
) -> Iterator[tuple[str, Binding]]:
    if isinstance(node, ast.ClassDef):
        yield node.name, Binding("class", node)
    elif isinstance(node, _Function):
        yield node.name, Binding("function", node)
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            for name in _targets(target):
                yield name, Binding("value", node.value)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        if node.value is not None:  # `x: int` alone binds nothing
            yield node.target.id, Binding("value", node.value)
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                yield alias.asname, Binding("module", target=alias.name)
            else:  # `import a.b` binds `a`
                head = alias.name.split(".")[0]
                yield head, Binding("module", target=head)
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, is_package, node.level, node.module)
        for alias in node.names:
            if alias.name != "*":
                yield alias.asname or alias.name, Binding("from", target=source, name=alias.name)
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        for name in _targets(node.target):
            yield name, Binding("value")
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        for item in node.items:
            if item.optional_vars is not None:
                for name in _targets(item.optional_vars):
                    yield name, Binding("value")


def bindings(
    body: list[ast.stmt], module: str = "", is_package: bool = False
) -> dict[str, Binding]:
    """Every name the run-time statements of ``body`` (a module's or a class's) bind, each
    at the binding Python leaves in place: the last, alternatives aside (the module's
    docstring); ``module`` and ``is_package`` resolve relative imports."""
    found: dict[str, Binding] = {}
    for node in body:
        found.update(_statement_bindings(node, module, is_package))
        for block in _blocks(node):
            found.update(bindings(block, module, is_package))
        alternatives = _alternatives(node)
        if alternatives:  # the first alternative to bind a name, then over what came before
            chosen: dict[str, Binding] = {}
            for block in alternatives:
                for name, binding in bindings(block, module, is_package).items():
                    chosen.setdefault(name, binding)
            found.update(chosen)
            found.update(bindings(getattr(node, "finalbody", []), module, is_package))
    return found


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The blocks of ``node`` that run after one another at import (a loop's body and
    ``else``, a ``with``'s body)."""
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [node.body]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        return [node.body, node.orelse]
    return []


def _alternatives(node: ast.stmt) -> list[list[ast.stmt]]:
    """The blocks of ``node`` of which one runs, the one that normally does first: an
    ``if``'s branches (``if TYPE_CHECKING:``'s body never), a ``try``'s body (with its
    ``else``) before its handlers."""
    if isinstance(node, ast.If):
        first = [] if _is_type_checking(node.test) else node.body
        return [first, node.orelse]
    if isinstance(node, ast.Try):
        return [node.body + node.orelse, *(handler.body for handler in node.handlers)]
    return []


def star_imports(body: list[ast.stmt], module: str, is_package: bool) -> list[str]:
    """The modules ``body`` imports ``*`` from, at run time."""
    return [
        _absolute(module, is_package, node.level, node.module)
        for node in runtime_statements(body)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
    ]


def classes(tree: ast.Module) -> Iterator[tuple[str, ast.ClassDef]]:
    """(qualified name, node) of every class a module defines at run time, nested classes
    too (``Outer.Inner``); a class defined inside a function is not reachable by name."""
    stack: list[tuple[str, list[ast.stmt]]] = [("", tree.body)]
    while stack:
        prefix, body = stack.pop()
        for node in runtime_statements(body):
            if isinstance(node, ast.ClassDef):
                qualname = f"{prefix}{node.name}"
                yield qualname, node
                stack.append((qualname + ".", node.body))


def find_class(tree: ast.Module, qualname: str) -> ast.ClassDef | None:
    """The class ``qualname`` (``Outer.Inner``) the module binds at run time (each name at
    its last binding, as :func:`bindings` says), or ``None`` (or another binding of it)."""
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for part in qualname.split("."):
        binding = bindings(body).get(part)
        node = binding.node if binding is not None and binding.kind == "class" else None
        if not isinstance(node, ast.ClassDef):
            return None
        body = node.body
    return node if isinstance(node, ast.ClassDef) else None


def _text(lines: list[str], node: ast.stmt) -> str:
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno, *(d.lineno for d in decorators)])
    last = node.end_lineno or node.lineno
    return textwrap.dedent("".join(lines[first - 1 : last]))


def _accessor_of(node: ast.stmt) -> str | None:
    """``x`` for a method decorated ``@x.setter`` (or ``.deleter``, ``.getter``)."""
    for decorator in getattr(node, "decorator_list", []):
        if isinstance(decorator, ast.Attribute) and decorator.attr in _ACCESSORS:
            return dotted(decorator.value)
    return None


def class_members(node: ast.ClassDef, source: str) -> dict[str, str]:
    """What a class's own dict holds, by name, with the source text binding it: each method's
    definition (a property's getter: a ``@x.setter`` keeps ``x``'s getter, as ``vars(cls)``'s
    property does; any other name defined twice: the last definition, as at run time), and
    every other name its body binds, with that statement's text."""
    lines = source.splitlines(keepends=True)
    members: dict[str, str] = {}
    for statement in runtime_statements(node.body):
        if isinstance(statement, _Function):
            if _accessor_of(statement) in members:
                continue
            members[statement.name] = _text(lines, statement)
        else:
            for name, _ in _statement_bindings(statement, "", False):
                members[name] = _text(lines, statement)
    return members


def instance_attributes(node: ast.ClassDef) -> set[str]:
    """The names a class's methods assign on ``self`` (``self.x = ...``)."""
    found: set[str] = set()
    for statement in node.body:
        if not isinstance(statement, _Function) or not statement.args.args:
            continue
        me = statement.args.args[0].arg
        for sub in ast.walk(statement):
            targets: list[ast.expr] = []
            if isinstance(sub, ast.Assign):
                targets = sub.targets
            elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                targets = [sub.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and dotted(target.value) == me:
                    found.add(target.attr)
    return found


def _is_member(name: str, value: ast.expr) -> bool:
    if name.startswith("_") and (name.endswith("_") or name.startswith("__")):
        return False  # _sunder_ and __dunder__ names are never members
    if isinstance(value, ast.Lambda):
        return False
    called = dotted(value.func) if isinstance(value, ast.Call) else None
    return called is None or called.rsplit(".", 1)[-1] not in _DESCRIPTORS


def enum_members(node: ast.ClassDef) -> dict[str, object]:
    """The members an enum class's body defines, by name, with their values: a literal's
    value, ``auto()`` numbered (the last integer value plus one, from 1), and for any other
    value its source text."""
    members: dict[str, object] = {}
    last = 0
    for statement in node.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if not isinstance(target, ast.Name) or not _is_member(target.id, value):
            continue
        if isinstance(value, ast.Call) and dotted(value.func) in ("auto", "enum.auto"):
            found: object = last + 1
        else:
            try:
                found = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                found = ast.unparse(value)
        if isinstance(found, int) and not isinstance(found, bool):
            last = found
        members[target.id] = found
    return members
