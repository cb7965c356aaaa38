"""A release's WAR surface: what an engine's write-after-read fence touches, read from its
wheel's source (nothing imported), as data an integration keeps beside each audited entry.

What the surface is per engine is the integration's data: a tuple of extractors
(:data:`Spec`), each filling one named section with ``key -> value`` strings. The extractors
are generic (the engine's names are their arguments):

* :class:`Definers`: every class (and module function) of the wheel binding one of the named
  declaration points, with the digest of what it binds;
* :class:`References`: every function of the wheel that reads one of the named attributes or
  names, or calls one, with each use (the statement, or a compound statement's header);
* :class:`Switches`: a class's (or module's) assignments whose name matches, with the
  assigned expression (an environment switch and its default);
* :class:`EnumMembers`: an enum's members and values;
* :class:`Registry`: a registry's names, each with the classes it builds (a dict literal, or
  factories registered by a decorator called with the name);
* :class:`ClassMembers`: a class's own members, with digests;
* :class:`Constructions`: every construction of the named classes, by owner class;
* :class:`StepRunners`: every function calling a step-running name (or passing one on), with
  its steps, waits and loops in source order;
* :class:`Branches`: a function's returns, each under the conditions leading to it.

:func:`compute` runs a spec over a :class:`~warcore.integration.wheel.SourceTree`;
:func:`differences` compares two surfaces; :func:`dump` / :func:`load` are the committed file
(JSON, one per audited release). What the surface cannot see: it reads source, not running
code (a name reached through ``getattr``, a class made by ``type()``, a function passed
around and called under another name, a default read from a file or the environment).

Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import source_code
from .engine_code import _canonical, _digest_node

__all__ = [
    "Branches",
    "ClassMembers",
    "Constructions",
    "Definers",
    "Difference",
    "EnumMembers",
    "Extractor",
    "References",
    "Registry",
    "Spec",
    "StepRunners",
    "Surface",
    "Switches",
    "compute",
    "differences",
    "dump",
    "load",
]

Surface = dict[str, dict[str, str]]
"""section -> key -> value."""

_Function = (ast.FunctionDef, ast.AsyncFunctionDef)


class Sources(Protocol):
    """What the extractors read (:class:`~warcore.integration.wheel.SourceTree`)."""

    def source(self, module: str) -> str | None: ...

    def tree(self, module: str) -> ast.Module | None: ...

    def mentioning(self, *words: str) -> list[str]: ...

    def locate(self, module: str, qualname: str) -> tuple[str, str] | None: ...


def _digest(node: ast.AST) -> str:
    if isinstance(node, _Function):
        return _digest_node(node)  # the digest a relied-on row of the same function has
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:16]


def _any_mentioning(tree: Sources, words: tuple[str, ...]) -> list[str]:
    return sorted({m for word in words for m in tree.mentioning(word)})


def _scopes(body: list[ast.stmt], prefix: str = "") -> Iterator[tuple[str, list[ast.stmt]]]:
    """(qualified prefix, body) of the module and each class it defines, nested ones too."""
    yield prefix, body
    for node in source_code.runtime_statements(body):
        if isinstance(node, ast.ClassDef):
            yield from _scopes(node.body, f"{prefix}{node.name}.")


def _functions(
    body: list[ast.stmt],
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualname, node) of every module function and method, each at its last binding (what
    Python runs); a nested function is part of the one defining it."""
    for prefix, scope in _scopes(body):
        last: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in source_code.runtime_statements(scope):
            if isinstance(node, _Function):
                last[node.name] = node
        for name, node in last.items():
            yield prefix + name, node


class Extractor:
    """One section of a surface."""

    section: str

    def extract(self, tree: Sources) -> dict[str, str]:
        raise NotImplementedError


@dataclass(frozen=True)
class Definers(Extractor):
    """Every class of the wheel whose body binds one of ``names`` (and every module function
    of those names): ``module:Class.name`` -> the digest of its last binding."""

    section: str
    names: tuple[str, ...]

    def extract(self, tree: Sources) -> dict[str, str]:
        found: dict[str, str] = {}
        for module in _any_mentioning(tree, self.names):
            parsed = tree.tree(module)
            for prefix, scope in _scopes(parsed.body) if parsed else ():
                for node in source_code.runtime_statements(scope):
                    for name in _bound_names(node):
                        if name in self.names:
                            found[f"{module}:{prefix}{name}"] = _digest(node)
        return found


def _bound_names(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, (*_Function, ast.ClassDef)):
        yield node.name
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        yield node.target.id


def _header(node: ast.stmt) -> list[ast.AST]:
    """What a statement itself evaluates, its nested blocks left out."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target, node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return list(node.items)
    if isinstance(node, ast.Try):
        return [h.type for h in node.handlers if h.type is not None]
    if isinstance(node, (*_Function, ast.ClassDef)):
        return []
    return [node]


def _header_text(node: ast.stmt) -> str:
    if isinstance(node, (ast.If, ast.While)):
        return f"{type(node).__name__.lower()} {ast.unparse(node.test)}:"
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}:"
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return "with " + ", ".join(ast.unparse(item) for item in node.items) + ":"
    return ast.unparse(node)


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    blocks: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        value = getattr(node, name, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            blocks.append(value)
    blocks += [h.body for h in getattr(node, "handlers", [])]
    return blocks


def _names_in(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            yield sub.attr
        elif isinstance(sub, ast.Name):
            yield sub.id


def _uses(body: list[ast.stmt], names: frozenset[str]) -> Iterator[str]:
    """Each statement of ``body`` (nested blocks entered, in source order) that names one of
    ``names``: its text, a compound statement's header only."""
    for node in body:
        if any(n in names for part in _header(node) for n in _names_in(part)):
            yield " ".join(_header_text(node).split())
        for block in _blocks(node):
            yield from _uses(block, names)


@dataclass(frozen=True)
class References(Extractor):
    """Every function of the wheel naming one of ``names`` (reading an attribute, calling
    it): ``module:qualname`` -> its uses, in source order, `` | `` between them."""

    section: str
    names: tuple[str, ...]

    def extract(self, tree: Sources) -> dict[str, str]:
        wanted = frozenset(self.names)
        found: dict[str, str] = {}
        for module in _any_mentioning(tree, self.names):
            parsed = tree.tree(module)
            for qualname, node in _functions(parsed.body) if parsed else ():
                uses = list(_uses(node.body, wanted))  # each, in order: a count is a fact
                if uses:
                    found[f"{module}:{qualname}"] = " | ".join(uses)
        return found


def _scope_of(tree: Sources, module: str, owner: str) -> list[ast.stmt] | None:
    """The body of the class ``owner`` of ``module`` (its module's body for ``""``)."""
    parsed = tree.tree(module)
    if parsed is None or not owner:
        return parsed.body if parsed else None
    node = source_code.find_class(parsed, owner)
    return node.body if node is not None else None


@dataclass(frozen=True)
class Switches(Extractor):
    """The assignments of class ``owner`` of ``module`` (its module's, for ``""``) whose
    name matches ``pattern``: name -> the assigned expression (``EnvBool(True)``)."""

    section: str
    module: str
    owner: str
    pattern: str

    def extract(self, tree: Sources) -> dict[str, str]:
        found: dict[str, str] = {}
        for node in source_code.runtime_statements(_scope_of(tree, self.module, self.owner) or []):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is None:
                continue
            for name in _bound_names(node):
                if re.search(self.pattern, name):
                    found[name] = ast.unparse(value)
        return found


@dataclass(frozen=True)
class EnumMembers(Extractor):
    """The members of the enum ``cls`` of ``module``: name -> value."""

    section: str
    module: str
    cls: str

    def extract(self, tree: Sources) -> dict[str, str]:
        where = tree.locate(self.module, self.cls) or (self.module, self.cls)
        parsed = tree.tree(where[0])
        node = source_code.find_class(parsed, where[1]) if parsed else None
        members = source_code.enum_members(node) if node else {}
        return {name: repr(value) for name, value in members.items()}


@dataclass(frozen=True)
class ClassMembers(Extractor):
    """The members the class ``cls`` of ``module`` binds itself: name -> digest."""

    section: str
    module: str
    cls: str

    def extract(self, tree: Sources) -> dict[str, str]:
        found: dict[str, str] = {}
        for node in source_code.runtime_statements(_scope_of(tree, self.module, self.cls) or []):
            for name in _bound_names(node):
                found[f"{self.cls}.{name}"] = _digest(node)
        return found


def _returned_classes(tree: Sources, module: str, factory: ast.AST) -> list[str]:
    """``module:Class`` of each call a factory returns, its local imports and the module's
    own followed (a name the wheel does not bind stays a bare name)."""
    local: dict[str, str] = {}
    for sub in ast.walk(factory):
        if isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
            for alias in sub.names:
                local[alias.asname or alias.name] = f"{sub.module}:{alias.name}"
    found: list[str] = []
    returns = [sub for sub in ast.walk(factory) if isinstance(sub, ast.Return)]
    for sub in sorted(returns, key=lambda r: r.lineno):  # in source order (walk is not)
        if isinstance(sub.value, ast.Call):
            name = source_code.dotted(sub.value.func)
            if name is None:
                continue
            located = tree.locate(module, name)
            where = local.get(name) or (f"{located[0]}:{located[1]}" if located else name)
            found.append(where)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Registry(Extractor):
    """A registry of ``module``: the dict literal ``name`` (key -> the class its value
    names), or, with ``decorator``, each function decorated ``@decorator("key")``: key ->
    the classes it returns (`` | `` between them)."""

    section: str
    module: str
    name: str = ""
    decorator: str = ""

    def extract(self, tree: Sources) -> dict[str, str]:
        parsed = tree.tree(self.module)
        found: dict[str, str] = {}
        for node in source_code.runtime_statements(parsed.body if parsed else []):
            if isinstance(node, _Function) and self.decorator:
                for key in self._keys(node):
                    found[key] = " | ".join(_returned_classes(tree, self.module, node))
            elif self._is_literal(node):
                assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                found.update(self._literal(tree, node.value))
        return found

    def _is_literal(self, node: ast.stmt) -> bool:
        is_dict = isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        return bool(self.name) and is_dict and self.name in _bound_names(node)

    def _keys(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[str]:
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and source_code.dotted(decorator.func) == (
                self.decorator
            ):
                first = decorator.args[0] if decorator.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield first.value

    def _literal(self, tree: Sources, node: ast.Dict) -> dict[str, str]:
        found: dict[str, str] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                name = source_code.dotted(value)
                located = tree.locate(self.module, name) if name else None
                found[key.value] = f"{located[0]}:{located[1]}" if located else ast.unparse(value)
        return found


def _call_name(node: ast.Call) -> str:
    name = source_code.dotted(node.func)
    return name.rsplit(".", 1)[-1] if name else ""


@dataclass(frozen=True)
class Constructions(Extractor):
    """Every call constructing one of ``classes`` anywhere in the wheel, by owner:
    ``module:Class`` (``module:function`` outside a class) -> each construction."""

    section: str
    classes: tuple[str, ...]

    def extract(self, tree: Sources) -> dict[str, str]:
        found: dict[str, list[str]] = {}
        for module in _any_mentioning(tree, self.classes):
            parsed = tree.tree(module)
            for qualname, node in _functions(parsed.body) if parsed else ():
                owner = qualname.rsplit(".", 1)[0]
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Call) and _call_name(sub) in self.classes:
                        found.setdefault(f"{module}:{owner}", []).append(ast.unparse(sub))
        return {owner: " | ".join(calls) for owner, calls in found.items()}


@dataclass(frozen=True)
class StepRunners(Extractor):
    """Every function of the wheel that runs a step (calls one of ``steps``, or passes one on
    to another call): ``module:qualname`` -> its steps (``step NAME``, ``via CALLEE``), waits
    (``wait NAME``: a call of one of ``waits``) and loops (``loop[...]``), in source order."""

    section: str
    steps: tuple[str, ...]
    waits: tuple[str, ...]

    def extract(self, tree: Sources) -> dict[str, str]:
        found: dict[str, str] = {}
        for module in _any_mentioning(tree, self.steps):
            parsed = tree.tree(module)
            for qualname, node in _functions(parsed.body) if parsed else ():
                events = self._events(node.body)
                if any(e.startswith(("step ", "via ")) or "[" in e for e in events):
                    found[f"{module}:{qualname}"] = ", ".join(events)
        return found

    def _events(self, body: list[ast.stmt]) -> list[str]:
        events: list[str] = []
        for node in body:
            for part in _header(node):
                events += self._calls(part)
            inner = [e for block in _blocks(node) for e in self._events(block)]
            loop = isinstance(node, (ast.For, ast.AsyncFor, ast.While))
            if loop and inner:
                events.append(f"loop[{', '.join(inner)}]")
            elif isinstance(node, _Function) and inner:
                events.append(f"def {node.name}[{', '.join(inner)}]")
            else:
                events += inner
        return events

    def _calls(self, node: ast.AST) -> list[str]:
        calls = sorted(
            (sub for sub in ast.walk(node) if isinstance(sub, ast.Call)),
            key=lambda c: (c.lineno, c.col_offset),
        )
        events: list[str] = []
        for call in calls:
            name = _call_name(call)
            if name in self.steps:
                events.append(f"step {name}")
            elif name in self.waits:
                events.append(f"wait {name}")
            elif any(source_code.dotted(a) in self.steps for a in call.args):
                events.append(f"via {name}")
        return events


@dataclass(frozen=True)
class Branches(Extractor):
    """The returns of the function ``qualname`` of ``module``, each under the conditions
    leading to it: ``if A / not B`` (``always`` for none) -> the returned expression."""

    section: str
    module: str
    qualname: str

    def extract(self, tree: Sources) -> dict[str, str]:
        parsed = tree.tree(self.module)
        node = dict(_functions(parsed.body)).get(self.qualname) if parsed else None
        found: dict[str, str] = {}
        for conditions, value in _returns(node.body if node else [], ()):
            found[" / ".join(conditions) or "always"] = value
        return found


def _returns(
    body: list[ast.stmt], conditions: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], str]]:
    for node in body:
        if isinstance(node, ast.Return):
            yield conditions, ast.unparse(node.value) if node.value else "None"
            return
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            yield from _returns(node.body, (*conditions, f"if {test}"))
            yield from _returns(node.orelse, (*conditions, f"not {test}"))
            if _always_returns(node.body) and not node.orelse:
                conditions = (*conditions, f"not {test}")


def _always_returns(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


Spec = tuple[Extractor, ...]
"""An engine's surface: its extractors, each one section."""


def compute(spec: Spec, tree: Sources) -> Surface:
    """The surface ``spec`` says, read from ``tree``: every section, even an empty one; a
    section whose source this reader cannot follow (nested past the interpreter's recursion
    limit) is one entry saying so, which differs from any recorded surface: a human reads it."""
    surface: Surface = {}
    for extractor in spec:
        try:
            found = extractor.extract(tree)
        except RecursionError:
            found = {"(not read)": "a source nested deeper than this reader follows"}
        surface[extractor.section] = dict(sorted(found.items()))
    return surface


@dataclass(frozen=True)
class Difference:
    """One entry of a section that differs: added (``old`` ``None``), removed (``new``
    ``None``) or changed."""

    section: str
    key: str
    old: str | None
    new: str | None

    @property
    def kind(self) -> str:
        return "added" if self.old is None else "removed" if self.new is None else "changed"

    def line(self) -> str:
        if self.old is None:
            return f"{self.section}: {self.key} added: {self.new}"
        if self.new is None:
            return f"{self.section}: {self.key} removed (was {self.old})"
        return f"{self.section}: {self.key} changed: {self.old} -> {self.new}"


def differences(
    old: Mapping[str, Mapping[str, str]], new: Mapping[str, Mapping[str, str]]
) -> list[Difference]:
    """Every entry that differs between two surfaces, section by section (a section only one
    of them has: each of its entries added or removed)."""
    found: list[Difference] = []
    for section in dict.fromkeys([*old, *new]):
        before, after = old.get(section, {}), new.get(section, {})
        for key in sorted({*before, *after}):
            if before.get(key) != after.get(key):
                found.append(Difference(section, key, before.get(key), after.get(key)))
    return found


def dump(surface: Surface, **about: str) -> str:
    """The committed file: ``about`` (engine, version, wheel, sha256) and the sections."""
    return json.dumps({**about, "sections": surface}, indent=1, sort_keys=True) + "\n"


def load(path: Path) -> tuple[Surface, dict[str, Any]]:
    """(sections, everything else) of a file :func:`dump` wrote; :class:`ValueError` naming
    the file for one that is not."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        sections = data.pop("sections")
        surface = {s: {str(k): str(v) for k, v in rows.items()} for s, rows in sections.items()}
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ValueError(f"{path}: not a surface file ({type(exc).__name__}: {exc})") from None
    return surface, data
