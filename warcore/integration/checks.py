"""Structural checks: what an integration relies on in an engine module beyond the code of its
functions, as data.

A release's entry (:class:`~warcore.integration.releases.Release`) lists, per module, the
checks its declarations and patches need: enum members and their values, module globals,
attributes of a module-level object, that a function calls another, that an attribute is a
plain instance attribute, that a function returns a list of so many items, and, over a class
and every subclass, who assigns an attribute, that a method is not redefined, and how a method
is called. Each check runs on the live module
(:meth:`Check.live`, where the module is imported, before it is patched) and raises
:class:`~warcore.integration.engine_code.ShapeMismatch` naming itself; ``warcore release``
evaluates the same checks on a release's source files without importing them
(:meth:`Check.in_source`).

Standard library only; pure inspection.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Protocol

from . import source_code
from .engine_code import (
    ShapeMismatch,
    assigns,
    calls,
    definition,
    definition_in_source,
    method_sources,
    resolve,
)
from .patching import subclasses

__all__ = [
    "AssignedOnlyIn",
    "Attributes",
    "Calls",
    "CallsWith",
    "Check",
    "ClassCheck",
    "ClassTree",
    "Globals",
    "InstanceAttribute",
    "Members",
    "NotRedefined",
    "ReturnsList",
    "SourceIndex",
    "require",
]


def require(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise ShapeMismatch(check, detail)


class SourceIndex(Protocol):
    """A release's source files, read without importing them (``warcore release``)."""

    def source(self, module: str) -> str | None:
        """The module's source text, ``None`` where the release has no such module."""

    def subclasses(self, module: str, qualname: str) -> list[tuple[str, str]]:
        """(module, qualname) of every class of the release deriving from that class."""

    def locate(self, module: str, qualname: str) -> tuple[str, str] | None:
        """(module, qualname) where the name ``qualname`` that ``module`` uses is bound (a
        class, a function, an assignment; its imports followed); ``(module, "")`` for a
        module of the release; ``None`` where the release does not bind it."""


class Check:
    """One structural fact about an engine module."""

    label: ClassVar[str] = ""
    """:attr:`name`, its fields filled in (``"{cls} members"``)."""

    @property
    def name(self) -> str:
        """What a failure is named by (``SharedReadEnds members``)."""
        return self.label.format(**vars(self))

    def live(self, module: ModuleType) -> None:
        """Raise :class:`ShapeMismatch` unless the imported ``module`` has the fact."""
        raise NotImplementedError

    def in_source(self, index: SourceIndex, module: str) -> None:
        """Raise :class:`ShapeMismatch` unless ``module``'s source has the fact."""
        raise NotImplementedError


# -- the source side: each check read from a release's source files (``warcore release``) --


def _parsed(index: SourceIndex, module: str) -> tuple[str, ast.Module]:
    """``module``'s source and syntax tree, or :class:`ShapeMismatch` naming the module."""
    source = index.source(module)
    require(source is not None, f"module {module}", "not in this release")
    assert source is not None
    try:
        return source, source_code.parse(source)
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise ShapeMismatch(f"module {module}", f"does not parse: {exc}") from None


def _class_in_source(
    index: SourceIndex, module: str, qualname: str
) -> tuple[str, ast.ClassDef, str]:
    """(defining module, node, that module's source) of the class ``module`` names
    ``qualname``: defined there or imported (followed to where it is defined)."""
    where, name = index.locate(module, qualname) or (module, qualname)
    source, tree = _parsed(index, where)
    node = source_code.find_class(tree, name)
    require(node is not None, qualname, f"not a class defined in {module}")
    assert node is not None
    return where, node, source


def _class_attributes(
    index: SourceIndex, module: str, node: ast.ClassDef, seen: set[tuple[str, str]]
) -> tuple[set[str], bool]:
    """The names a class and its bases in the release bind in their bodies, and whether one
    of them defines ``__getattr__`` (then any name may resolve: a human reads it)."""
    names = set(source_code.bindings(node.body))
    for base in filter(None, map(source_code.dotted, node.bases)):
        where = index.locate(module, base)
        if where is None or where in seen:
            continue  # a base outside the release (object, ABC): its names are not counted
        seen.add(where)
        _, tree = _parsed(index, where[0])
        base_node = source_code.find_class(tree, where[1])
        if base_node is not None:
            inherited, _ = _class_attributes(index, where[0], base_node, seen)
            names |= inherited
    return names, "__getattr__" in names


def _attr(module: ModuleType, qualname: str) -> Any:
    owner: Any = module
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
        require(owner is not None, qualname, f"not defined in {module.__name__}")
    return owner


@dataclass(frozen=True)
class Members(Check):
    """An enum class has exactly these members (with these values, when a mapping)."""

    label = "{cls} members"

    cls: str
    members: Mapping[str, int] | frozenset[str]

    def live(self, module: ModuleType) -> None:
        found_members = getattr(_attr(module, self.cls), "__members__", {})
        if isinstance(self.members, frozenset):
            found: Any = frozenset(found_members)
            detail = (
                f"{sorted(found ^ self.members)} differ from the audited {sorted(self.members)}"
            )
        else:
            found = {k: v.value for k, v in found_members.items()}
            detail = f"{found}, audited {dict(self.members)}"
        require(found == self.members, self.name, detail)

    def in_source(self, index: SourceIndex, module: str) -> None:
        _, node, _ = _class_in_source(index, module, self.cls)
        values = source_code.enum_members(node)
        if isinstance(self.members, frozenset):
            found: Any = frozenset(values)
            detail = (
                f"{sorted(found ^ self.members)} differ from the audited {sorted(self.members)}"
            )
            require(found == self.members, self.name, detail)
        else:
            detail = f"{values}, audited {dict(self.members)}"
            require(values == dict(self.members), self.name, detail)


@dataclass(frozen=True)
class Globals(Check):
    """The module binds these names at run time (not only for type checking)."""

    label = "module globals"

    names: tuple[str, ...]

    def live(self, module: ModuleType) -> None:
        for name in self.names:
            require(hasattr(module, name), f"module global {name}", "missing")

    def in_source(self, index: SourceIndex, module: str) -> None:
        _, tree = _parsed(index, module)
        bound = source_code.bindings(tree.body)
        for name in self.names:
            # a name bound through `from x import *` is found where x binds it
            found = name in bound or index.locate(module, name) is not None
            require(found, f"module global {name}", "missing (not bound at run time)")


@dataclass(frozen=True)
class Attributes(Check):
    """A module-level object has these attributes (``envs`` has each variable read)."""

    label = "{owner} attributes"

    owner: str
    names: tuple[str, ...]

    def live(self, module: ModuleType) -> None:
        owner = _attr(module, self.owner)
        missing = [n for n in self.names if not hasattr(owner, n)]
        require(not missing, self.name, f"{self.owner} lacks {', '.join(missing)}")

    def in_source(self, index: SourceIndex, module: str) -> None:
        names, dynamic = self._owner_names(index, module)
        missing = [n for n in self.names if n not in names]
        why = " (it defines __getattr__: read it by hand)" if dynamic else ""
        require(not missing, self.name, f"{self.owner} lacks {', '.join(missing)}{why}")

    def _owner_names(self, index: SourceIndex, module: str) -> tuple[set[str], bool]:
        """The names :attr:`owner` has, from the source: an instance of a class of the
        release (``envs = Envs()``: the class's names and what its methods set on
        ``self``), a class, or a module."""
        where = index.locate(module, self.owner)
        require(where is not None, self.name, f"{self.owner} is not defined in {module}")
        assert where is not None
        owner_module, name = where
        _, tree = _parsed(index, owner_module)
        if not name:  # a module: its run-time names
            return set(source_code.bindings(tree.body)), False
        node = source_code.find_class(tree, name)
        if node is not None:
            return _class_attributes(index, owner_module, node, {where})
        binding = source_code.bindings(tree.body).get(name)
        made_by = binding.node if binding is not None else None
        cls = source_code.dotted(made_by.func) if isinstance(made_by, ast.Call) else None
        made = index.locate(owner_module, cls) if cls else None
        if made is not None and made[1]:
            cls_module, node, _ = _class_in_source(index, *made)
            names, dynamic = _class_attributes(index, cls_module, node, {made})
            return names | source_code.instance_attributes(node), dynamic
        raise ShapeMismatch(self.name, f"{self.owner} is not read from source: check it by hand")


@dataclass(frozen=True)
class Calls(Check):
    """A function calls ``<something>.<callee>(...)``."""

    label = "{function}"

    function: str
    callee: str

    def live(self, module: ModuleType) -> None:
        found = calls(resolve(module, self.function), self.callee)
        require(found, self.name, f"no longer calls self.{self.callee}(...)")

    def in_source(self, index: SourceIndex, module: str) -> None:
        node = _function_in_source(index, module, self.function, self.name)
        found = any(
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == self.callee
            for sub in ast.walk(node)
        )
        require(found, self.name, f"no longer calls self.{self.callee}(...)")


def _function_in_source(index: SourceIndex, module: str, function: str, name: str) -> ast.AST:
    where, qualname = index.locate(module, function) or (module, function)
    source, _ = _parsed(index, where)
    try:
        return definition_in_source(source, qualname)
    except LookupError:
        raise ShapeMismatch(name, f"not defined in {module}") from None


@dataclass(frozen=True)
class ReturnsList(Check):
    """Every ``return`` of a function returns a list display of exactly ``length`` items (a
    message whose frames are read by index: what is appended lands after the last)."""

    label = "{function} returns {length} items"

    function: str
    length: int

    def live(self, module: ModuleType) -> None:
        self._judge(definition(resolve(module, self.function)))

    def in_source(self, index: SourceIndex, module: str) -> None:
        self._judge(_function_in_source(index, module, self.function, self.name))

    def _judge(self, node: ast.AST) -> None:
        found = [
            len(sub.value.elts) if isinstance(sub.value, ast.List) else None
            for sub in ast.walk(node)
            if isinstance(sub, ast.Return)
        ]
        shown = ", ".join("not a list display" if n is None else f"{n} items" for n in found)
        ok = bool(found) and all(n == self.length for n in found)
        require(ok, self.name, f"returns {shown or 'nothing'} (audited: {self.length} items)")


@dataclass(frozen=True)
class InstanceAttribute(Check):
    """``attr`` is a plain instance attribute of ``cls``: not in the class's own dict."""

    label = "{cls}.{attr}"

    cls: str
    attr: str

    def live(self, module: ModuleType) -> None:
        is_class_attr = self.attr in vars(_attr(module, self.cls))
        require(
            not is_class_attr, self.name, "is a class attribute (audited: a plain instance one)"
        )

    def in_source(self, index: SourceIndex, module: str) -> None:
        _, node, source = _class_in_source(index, module, self.cls)
        is_class_attr = self.attr in source_code.class_members(node, source)
        require(
            not is_class_attr, self.name, "is a class attribute (audited: a plain instance one)"
        )


class ClassCheck:
    """A fact about one class of a :class:`ClassTree` (``base``: it is the tree's root)."""

    def on_class(self, cls: type, base: bool) -> None:
        raise NotImplementedError

    def on_source(self, qualname: str, methods: Mapping[str, str], base: bool) -> None:
        """The same fact from the class's source: what its own dict holds, name -> the text
        binding it (each method's definition, and any other name its body binds with that
        statement: :func:`~warcore.integration.source_code.class_members`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class AssignedOnlyIn(ClassCheck):
    """Only these methods assign ``<something>.<attr>``: ``base`` on the root class,
    ``subclasses`` on each class deriving from it."""

    attr: str
    base: frozenset[str]
    subclasses: frozenset[str] = frozenset()
    exact_on_base: bool = False
    """The root assigns it in exactly :attr:`base` (not merely no more)."""

    def on_class(self, cls: type, base: bool) -> None:
        self._judge(cls.__qualname__, assigns(cls, self.attr), base)

    def on_source(self, qualname: str, methods: Mapping[str, str], base: bool) -> None:
        pattern = re.compile(rf"\.{self.attr}\s*(:[^=\n]*)?=(?!=)")
        found = {name for name, text in methods.items() if pattern.search(text)}
        self._judge(qualname, found, base)

    def _judge(self, qualname: str, found: set[str], base: bool) -> None:
        allowed = self.base if base else self.subclasses
        ok = found == allowed if base and self.exact_on_base else found <= allowed
        where = "the root class's" if base else "a subclass's"
        require(
            ok,
            f"{qualname}.{self.attr}",
            f"assigned in {sorted(found)} (audited: {where} {sorted(allowed)})",
        )


@dataclass(frozen=True)
class NotRedefined(ClassCheck):
    """No subclass defines ``attr`` of its own."""

    attr: str

    def on_class(self, cls: type, base: bool) -> None:
        self._judge(cls.__qualname__, self.attr in vars(cls), base)

    def on_source(self, qualname: str, methods: Mapping[str, str], base: bool) -> None:
        self._judge(qualname, self.attr in methods, base)

    def _judge(self, qualname: str, defined: bool, base: bool) -> None:
        require(base or not defined, f"{qualname}.{self.attr}", "redefined (audited: the root's)")


@dataclass(frozen=True)
class CallsWith(ClassCheck):
    """Every call of ``callee(...)`` in the class's methods passes ``argument`` first."""

    callee: str
    argument: str

    def on_class(self, cls: type, base: bool) -> None:
        self.on_source(cls.__qualname__, method_sources(cls), base)

    def on_source(self, qualname: str, methods: Mapping[str, str], base: bool) -> None:
        call = re.compile(rf"(?<!def ){re.escape(self.callee)}\(")
        right = re.compile(rf"{re.escape(self.callee)}\(\s*{re.escape(self.argument)}")
        for name, text in methods.items():
            require(
                len(call.findall(text)) == len(right.findall(text)),
                f"{qualname}.{name}",
                f"calls {self.callee} with another argument than {self.argument}",
            )


@dataclass(frozen=True)
class ClassTree(Check):
    """``facts`` hold for ``cls`` and every class deriving from it: those imported when the
    module is checked, and (the activation hooks them) those defined later."""

    label = "{cls} and its subclasses"

    cls: str
    facts: tuple[ClassCheck, ...]

    def live(self, module: ModuleType) -> None:
        root = _attr(module, self.cls)
        self.check_class(root, root)
        for sub in subclasses(root):
            self.check_class(sub, root)

    def check_class(self, cls: type, root: type) -> None:
        for fact in self.facts:
            fact.on_class(cls, cls is root)

    def in_source(self, index: SourceIndex, module: str) -> None:
        """Every fact on the root and on every subclass the release defines (all of them, not
        only those a process imports); every failure is named, each with its module."""
        where, root, source = _class_in_source(index, module, self.cls)
        classes = [(where, self.cls, root, source)]
        for sub_module, qualname in index.subclasses(module, self.cls):
            sub_source, tree = _parsed(index, sub_module)
            node = source_code.find_class(tree, qualname)
            if node is not None:
                classes.append((sub_module, qualname, node, sub_source))
        failures: list[str] = []
        for cls_module, qualname, node, text in classes:
            members = source_code.class_members(node, text)
            for fact in self.facts:
                try:
                    fact.on_source(qualname, members, node is root)
                except ShapeMismatch as exc:
                    failures.append(f"{exc} (in {cls_module})")
        require(not failures, self.name, "; ".join(failures))
