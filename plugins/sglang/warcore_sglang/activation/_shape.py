"""The shape gate: what warcore-sglang relies on in an sglang module, checked before patching it.

The version allowlist (:data:`warcore_sglang._names.AUDITED`) cannot see an sglang whose code
moved under an audited version number (an editable checkout with stale metadata, a fork, an
image built with a pretended version). So each watched module is checked when it is patched:
the members and signatures warcore-sglang calls, the module globals and environment variables
it reads, and a digest of every sglang function body it wraps or relies on (:func:`digest`: the
function's syntax tree without its docstring, so comments and formatting do not count). The
audited digests are stored beside the audited versions; ``tests/test_shape_gate.py`` recomputes
them from the installed wheel.

A check that fails raises :class:`ShapeMismatch` naming the check; the activation then passes
everything through to sglang (:func:`warcore_sglang.activation.install`). Pure inspection:
nothing here changes sglang.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import linecache
import re
import sys
import textwrap
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._names import AUDITED, SRT

__all__ = [
    "MODULE_CHECKS",
    "ShapeMismatch",
    "audit_in_source",
    "audit_table",
    "check_audited",
    "digest",
    "resolve",
]

_ENDS = {"PRE_REPLAY": 1, "IN_REPLAY": 2, "POST_REPLAY": 3, "UNKNOWN": 4}
_ENV = ("SGLANG_FORCE_COARSE_WAR_BARRIER", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
_ALGORITHMS = frozenset(
    ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
)
_SKIPPED_FIELDS = frozenset({"type_params", "type_comment", "kind"})
"""AST fields that differ between Python versions without changing what the code does."""


class ShapeMismatch(Exception):
    """An sglang module is not shaped as warcore-sglang audited it: ``check`` names what."""

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


def _tree(function: Callable[..., Any]) -> _Function:
    """``function``'s definition, read from the lines its code object came from (only that
    block is parsed, not its module)."""
    code = function.__code__
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise ShapeMismatch(function.__qualname__, f"no source in {code.co_filename}")
    return _parse(_block(lines, code.co_firstlineno), function.__qualname__)


def digest(function: Callable[..., Any]) -> str:
    """A digest of ``function``'s definition (name, signature, decorators and body, docstring
    left out): equal for the same code, whatever its comments and formatting."""
    return _digest_node(_tree(function))


def _find(source: str, qualname: str) -> _Function:
    """The definition of ``qualname`` in a module's ``source``, read as :func:`_tree` reads a
    live function (so that both digest the same text)."""
    scope: list[ast.stmt] = ast.parse(source).body
    *path, name = qualname.split(".")
    for part in path:
        scope = next(n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == part)
    for node in scope:
        if isinstance(node, _Function) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return _parse(_block(source.splitlines(keepends=True), first), qualname)
    raise LookupError(f"{qualname} is not defined in that source")


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


def signature(function: Callable[..., Any]) -> str:
    """``function``'s parameters as written, without annotations: ``(self, fm)``."""
    sig = inspect.signature(function)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def resolve(module: ModuleType, qualname: str) -> Callable[..., Any]:
    """The function ``qualname`` names in ``module`` (``Class.method``, a property's getter),
    as the owner itself defines it (never inherited), under any warcore-sglang patch."""
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


def check_audited(module: ModuleType, version: str, owner: str = "") -> None:
    """Every audited function of ``module`` (of class ``owner`` only, when given) has its
    audited signature and digest under ``version``."""
    audited = AUDITED.get(version, {}).get(module.__name__.removeprefix(SRT), {})
    for qualname, (sig, code) in audited.items():
        if owner and not qualname.startswith(owner + "."):
            continue
        function = resolve(module, qualname)
        if signature(function) != sig:
            raise ShapeMismatch(f"signature of {qualname}", f"{signature(function)}, audited {sig}")
        if code and digest(function) != code:
            raise ShapeMismatch(
                f"code of {qualname}",
                f"its body differs from the audited {version} (digest {digest(function)}, "
                f"audited {code})",
            )


def _require(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise ShapeMismatch(check, detail)


def _calls(function: Callable[..., Any], name: str) -> bool:
    """``function`` calls ``<something>.<name>(...)``."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        for node in ast.walk(_tree(function))
    )


def _writers(cls: type, attr: str) -> set[str]:
    """The methods ``cls`` itself defines that assign ``<something>.<attr>`` (their source,
    searched as text: a comment that looks like one counts too, the safe side)."""
    pattern = re.compile(rf"\.{attr}\s*(:[^=\n]*)?=(?!=)")
    found: set[str] = set()
    for name, value in vars(cls).items():
        function = getattr(value, "fget", value)
        function = getattr(function, "__func__", function)
        code = getattr(function, "__code__", None)
        if code is None:
            continue
        lines = linecache.getlines(code.co_filename)
        if lines and pattern.search(_block(lines, code.co_firstlineno)):
            found.add(name)
    return found


def _check_base(module: ModuleType) -> None:
    ends = getattr(module, "SharedReadEnds", None)
    members = {k: v.value for k, v in getattr(ends, "__members__", {}).items()}
    _require(members == _ENDS, "SharedReadEnds members", f"{members}, audited {_ENDS}")
    _require(callable(getattr(ends, "max_of", None)), "SharedReadEnds.max_of", "missing")
    for name in ("envs", "ForwardMode", "AttentionBackend"):
        _require(hasattr(module, name), f"module global {name}", "missing")
    missing = [v for v in _ENV if not hasattr(module.envs, v)]
    _require(not missing, "environment variables", f"sglang's envs lacks {', '.join(missing)}")


def _check_spec_info(module: ModuleType) -> None:
    members = set(module.SpeculativeAlgorithm.__members__)
    _require(
        members == _ALGORITHMS,
        "SpeculativeAlgorithm members",
        f"{sorted(members ^ _ALGORITHMS)} differ from the audited {sorted(_ALGORITHMS)}",
    )


def _check_spec_registry(module: ModuleType) -> None:
    for name in ("_REGISTRY", "get_spec", "CustomSpecAlgo"):
        _require(hasattr(module, name), f"spec_registry.{name}", "missing")


def _check_decode_runner(module: ModuleType) -> None:
    runner = module.DecodeCudaGraphRunner
    _require(
        _calls(runner.execute, "_resolve_shared_read_ends"),
        "DecodeCudaGraphRunner.execute",
        "no longer calls self._resolve_shared_read_ends(...)",
    )
    writers = _writers(runner, "in_graph_metadata_prep_done")
    audited = {"__init__", "_record_in_graph_metadata_prep_done"}
    _require(
        writers == audited,
        "DecodeCudaGraphRunner.in_graph_metadata_prep_done",
        f"assigned in {sorted(writers)}, audited {sorted(audited)}",
    )


def _check_model_runner(module: ModuleType) -> None:
    _require(
        "shared_read_done_event" not in vars(module.ModelRunner),
        "ModelRunner.shared_read_done_event",
        "is a class attribute (audited: a plain instance attribute)",
    )


MODULE_CHECKS: dict[str, Callable[[ModuleType], None]] = {
    SRT + "layers.attention.base_attn_backend": _check_base,
    SRT + "speculative.spec_info": _check_spec_info,
    SRT + "speculative.spec_registry": _check_spec_registry,
    SRT + "model_executor.runner.decode_cuda_graph_runner": _check_decode_runner,
    SRT + "model_executor.model_runner": _check_model_runner,
}
"""Structural checks beyond the audited functions, per module (the others have none)."""


def audit_table(version: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The installed sglang's (signature, digest) of every function audited in ``version``
    (the digest ``""`` where that version records none), read from the source files."""
    import importlib.util

    table: dict[str, dict[str, tuple[str, str]]] = {}
    for module, functions in AUDITED[version].items():
        spec = importlib.util.find_spec(SRT + module)
        if spec is None or spec.origin is None:
            raise LookupError(f"{SRT + module} is not installed")
        with open(spec.origin, encoding="utf-8") as file:
            source = file.read()
        table[module] = {}
        for qualname, (_, code) in functions.items():
            sig, found = audit_in_source(source, qualname)
            table[module][qualname] = (sig, found if code else "")
    return table


if __name__ == "__main__":  # pragma: no cover - prints the table to paste into _names.py
    base = sys.argv[1] if len(sys.argv) > 1 else next(iter(AUDITED))
    for module, functions in audit_table(base).items():
        print(f'        "{module}": {{')
        for qualname, (sig, code) in functions.items():
            print(f'            "{qualname}": ("{sig}", "{code}"),')
        print("        },")
