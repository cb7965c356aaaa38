"""Is the engine's code the code an integration audited? Checked before patching it.

An integration that patches a real engine (warcore-sglang, warcore-vllm) relies on the
engine's functions being what it read: their signatures, and what their bodies do. A version
number cannot promise that (an editable checkout with stale metadata, a fork, an image built
with a pretended version, a post release), so an integration records, per audited version,
each relied-on function's signature and a digest of its definition (:func:`digest`: the syntax
tree of the function's own block, docstring left out, so comments and formatting do not count
and the digest is the same on every Python version), and checks them where each module is
patched. A function that differs raises :class:`ShapeMismatch` naming it; the integration then
passes everything through to the engine. :func:`audit_in_source` computes the same from a
module's source without importing it, to record a new version's table and to test the stored
one against an installed wheel.

Standard library only; pure inspection: nothing here changes the engine.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import linecache
import re
import textwrap
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "ShapeMismatch",
    "assigns",
    "audit_in_source",
    "audit_module_source",
    "calls",
    "check_functions",
    "definition",
    "definition_in_source",
    "digest",
    "method_sources",
    "resolve",
    "resolve_class",
    "signature",
]

_SKIPPED_FIELDS = frozenset({"type_params", "type_comment", "kind"})
"""AST fields that differ between Python versions without changing what the code does."""


class ShapeMismatch(Exception):
    """An engine module is not shaped as an integration audited it: ``check`` names what."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


def _canonical(node: Any) -> str:
    """The tree as text, empty fields and version-specific ones left out (``ast.dump``'s output
    differs between Python versions)."""
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_canonical(value)}"
            for name, value in ast.iter_fields(node)
            if name not in _SKIPPED_FIELDS and value is not None and value != []
        ]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


_Function = ast.FunctionDef | ast.AsyncFunctionDef


def _digest_node(node: _Function) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    fields = [node.name, node.args, node.decorator_list, node.returns, body]
    return hashlib.sha256(_canonical(fields).encode()).hexdigest()[:16]


def _block(lines: list[str], first: int) -> str:
    """The definition starting at line ``first`` (1-based, its first decorator), dedented: the
    same text whether it comes from a live function or from a module's source."""
    return textwrap.dedent("".join(inspect.getblock(lines[first - 1 :])))


def _parse(text: str, where: str) -> _Function:
    node = ast.parse(text).body[0]
    if not isinstance(node, _Function):
        raise ShapeMismatch(where, "its source is not a function definition")
    return node


def definition(function: Callable[..., Any]) -> _Function:
    """``function``'s definition, read from the lines its code object came from (only that
    block is parsed, not its module). A function a decorator wrapped (``functools.wraps``:
    ``contextlib.contextmanager``, ``torch.no_grad()``) is read where it is written, not where
    the decorator's wrapper is."""
    function = inspect.unwrap(function)
    text = _source(function)
    if text is None:
        raise ShapeMismatch(function.__qualname__, f"no source in {function.__code__.co_filename}")
    return _parse(text, function.__qualname__)


def _source(function: Callable[..., Any]) -> str | None:
    """The block ``function`` (unwrapped: where it is written) is defined in, or ``None``
    where its file has no lines to read."""
    code = inspect.unwrap(function).__code__
    lines = linecache.getlines(code.co_filename)
    return _block(lines, code.co_firstlineno) if lines else None


def digest(function: Callable[..., Any]) -> str:
    """A digest of ``function``'s definition (name, signature, decorators and body, docstring
    left out): equal for the same code, whatever its comments and formatting."""
    return _digest_node(definition(function))


def _find(source: str, qualname: str) -> _Function:
    """The definition of ``qualname`` in a module's ``source``, read as :func:`definition` reads a
    live function (so that both digest the same text): the one Python binds, the last of its
    scope (a property's ``@x.setter`` and ``@x.deleter`` keep ``x``'s getter, as
    :func:`resolve` reads it); a name whose last binding is not a ``def`` is not defined."""
    scope: list[ast.stmt] = ast.parse(source).body
    *path, name = qualname.split(".")
    for part in path:
        found = [n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == part]
        if not found:  # not StopIteration, out of a function: a missing class is a lookup
            raise LookupError(f"class {part} of {qualname} is not defined in that source")
        scope = found[-1]
    bound = [node for node in scope if _binds(node, name)]
    node = bound[-1] if bound else None
    if not isinstance(node, _Function):
        raise LookupError(f"{qualname} is not defined in that source")
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return _parse(_block(source.splitlines(keepends=True), first), qualname)


def _binds(node: ast.stmt, name: str) -> bool:
    """``node`` (re)binds ``name`` in its scope: a ``def`` (not a property's setter or deleter,
    which keep its getter), a class, an assignment or an import of it."""
    if isinstance(node, _Function):
        accessors = {f"{name}.setter", f"{name}.deleter"}
        return node.name == name and not any(
            ast.unparse(d) in accessors for d in node.decorator_list
        )
    if isinstance(node, ast.ClassDef):
        return node.name == name
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and getattr(node, "value", None):
        targets = [node.target]
    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
        return True
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    return False


def definition_in_source(source: str, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """The definition of the function ``qualname`` in a module's ``source``, read as
    :func:`definition` reads a live function; :class:`LookupError` where it is not defined
    there. Raises :class:`SyntaxError` for a source that does not parse."""
    return _find(source, qualname)


def _node_signature(node: _Function) -> str:
    """What :func:`signature` says of the function ``node`` defines, from its source."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [
        a.arg + (f"={ast.unparse(d)}" if d else "")
        for a, d in zip(positional, defaults, strict=True)
    ]
    if args.posonlyargs:
        parts.insert(len(args.posonlyargs), "/")
    if args.vararg:
        parts.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        parts.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        parts.append(a.arg + (f"={ast.unparse(d)}" if d else ""))
    if args.kwarg:
        parts.append("**" + args.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def audit_in_source(source: str, qualname: str) -> tuple[str, str]:
    """(signature, digest) of the function ``qualname`` defined in a module's ``source``,
    without importing the module (a worker module that imports a GPU-only package, say)."""
    node = _find(source, qualname)
    return _node_signature(node), _digest_node(node)


def audit_module_source(module: str, qualnames: Iterable[str]) -> dict[str, tuple[str, str]]:
    """:func:`audit_in_source` of each function of ``qualnames`` in the installed module named
    ``module``, read from its source file (the module itself is not imported; its parent
    packages are, to find it)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise LookupError(f"{module} is not installed as a source file")
    with open(spec.origin, encoding="utf-8") as file:
        source = file.read()
    return {qualname: audit_in_source(source, qualname) for qualname in qualnames}


def check_functions(
    module: ModuleType, audited: Mapping[str, tuple[str, str]], version: str
) -> None:
    """Each function of ``audited`` (qualified name -> (signature, digest), a digest ``""``
    checking the signature only) is defined in ``module`` with that signature and digest, or
    :class:`ShapeMismatch` names the first that is not (``version``: the audited release)."""
    for qualname, (audited_signature, audited_digest) in audited.items():
        function = resolve(module, qualname)
        found = signature(function)
        if found != audited_signature:
            raise ShapeMismatch(f"signature of {qualname}", f"{found}, audited {audited_signature}")
        if audited_digest and digest(function) != audited_digest:
            raise ShapeMismatch(
                f"code of {qualname}",
                f"its body differs from the audited {version} (digest {digest(function)}, "
                f"audited {audited_digest})",
            )


def signature(function: Callable[..., Any]) -> str:
    """``function``'s parameters as written, without annotations: ``(self, fm)``."""
    sig = inspect.signature(function)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def resolve(module: ModuleType, qualname: str) -> Callable[..., Any]:
    """The function ``qualname`` names in ``module`` (``Class.method``, a property's getter),
    as the owner itself defines it (never inherited), under any patch that remembers what it
    replaced in ``__warcore_original__``."""
    owner: Any = module
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    value: Any = vars(owner).get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    while hasattr(value, "__warcore_original__"):
        value = value.__warcore_original__
    if isinstance(value, property):
        value = value.fget
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if not callable(value):
        raise ShapeMismatch(qualname, f"not defined in {module.__name__}")
    function: Callable[..., Any] = value
    return function


def resolve_class(module: ModuleType, qualname: str) -> type:
    """The class ``qualname`` names in ``module``, or :class:`ShapeMismatch`."""
    owner: Any = module
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    if not isinstance(owner, type):
        raise ShapeMismatch(qualname, f"not a class defined in {module.__name__}")
    return owner


def calls(function: Callable[..., Any], name: str) -> bool:
    """``function`` calls ``<something>.<name>(...)``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        for node in ast.walk(definition(function))
    )


_SOURCES: weakref.WeakKeyDictionary[type, dict[str, str]] = weakref.WeakKeyDictionary()


def method_sources(cls: type) -> dict[str, str]:
    """The source of each method ``cls`` itself defines (a property's getter, a class or static
    method's function), by name: what :func:`assigns` and an integration's own checks search.
    Read once per class (each block is tokenized to find where it ends), and kept only while
    the class lives."""
    found = _SOURCES.get(cls)
    if found is not None:
        return found
    out: dict[str, str] = {}
    for name, value in vars(cls).items():
        function = getattr(value, "fget", value)
        function = getattr(function, "__func__", function)
        if getattr(function, "__code__", None) is None:
            continue
        text = _source(function)  # a decorated method: its own lines, not the decorator's
        if text is not None:
            out[name] = text
    _SOURCES[cls] = out
    return out


def assigns(cls: type, attr: str) -> set[str]:
    """The methods ``cls`` itself defines that assign ``<something>.<attr>`` (their source,
    searched as text: a comment that looks like one counts too, the safe side)."""
    pattern = re.compile(rf"\.{attr}\s*(:[^=\n]*)?=(?!=)")
    return {name for name, text in method_sources(cls).items() if pattern.search(text)}
