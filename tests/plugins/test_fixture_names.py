"""Fixture names cannot collide with real plugins: every name a test offers (a backend, an
algorithm, an engine flag), registers (a plugin) or installs (a fake distribution's entry
point) starts with the reserved prefix ``wctest_``, unless it is deliberately one of the names
the core or this repository's own plugins offer (a test of what happens when a name is taken).
Distribution names are not registry names and are left alone (``tests/_support/fake_dists.py`` names
its distributions ``warcore-fake-<name>``; one test needs a name that sorts first).

A real plugin must not use the prefix: the check at the end fails if an installed plugin
offers a ``wctest_`` name. So a CI engineer who installs a real Medusa plugin (algorithm
``medusa``) next to the core's suite gets no collision: the suite's own fake Medusa is
``wctest_medusa``.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

PREFIX = "wctest_"
TESTS = Path(__file__).resolve().parents[1]

OURS = frozenset(
    {
        # the core's: its plugin, backends, algorithms and engine flags
        "warcore",
        "torch_native",
        "hybrid",
        "layer_hybrid",
        "flashinfer",
        "none",
        "eagle",
        "hicache",
        # this repository's plugin distributions (plugins/, examples/, tests/fixtures/)
        "trtllm_mha",
        "deepseek_v4",
        "dflash",
        "dspark",
        "acme",
        "ngram",
        "broken_fixture",
    }
)
"""Names a test may use on purpose: they are the core's or this repository's, so a real
third-party plugin that takes one of them collides with warcore itself, not with a fixture."""

_SPECS = {"BackendSpec", "AlgorithmSpec", "FlagSpec", "DeclaredAlgorithm"}


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _const(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _source(node: ast.AST) -> str | None:
    """The text of a string literal that may be a plugin module's source (f-string fields
    filled with a valid name, so the rest still parses)."""
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else f"{PREFIX}field" for v in node.values]
        return "".join(str(p) for p in parts)
    return _const(node)


def offered_names(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """(line, what, name) for every constant fixture name in ``tree``, and in every string
    literal in it that is itself Python (a fake plugin module's source)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            kw = {k.arg: k.value for k in node.keywords}
            if name in _SPECS:
                value = _const(node.args[0] if node.args else kw.get("name"))
                if value is not None:
                    yield node.lineno, name, value
            elif name == "register" and _const(kw.get("name")) is not None:
                yield node.lineno, "registered plugin", str(_const(kw.get("name")))
            elif name == "fresh_manager":  # _support.fresh_manager(("name", plugin), ...)
                for arg in node.args:
                    if isinstance(arg, ast.Tuple) and arg.elts and _const(arg.elts[0]):
                        yield node.lineno, "registered plugin", str(_const(arg.elts[0]))
            elif name == "add" and node.args and _const(node.args[0]) is not None:
                yield node.lineno, "fake entry point", str(_const(node.args[0]))
        elif isinstance(node, ast.ClassDef):
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "name" for t in statement.targets)
                    and _const(statement.value) is not None
                ):
                    yield statement.lineno, f"{node.name}.name", str(_const(statement.value))
        text = _source(node) if isinstance(node, ast.Constant | ast.JoinedStr) else None
        if text and "warcore" in text and "\n" in text:
            try:
                inner = ast.parse(textwrap.dedent(text))
            except SyntaxError:
                continue
            for line, what, value in offered_names(inner):
                yield node.lineno + line - 1, f"{what} (in a module's source)", value


def _valid(name: str) -> bool:
    """A name a registry could hold (lowercase, digits, ``_``, from a letter): a deliberately
    invalid one (``Eagle``, ``2fast``) is refused before it can collide with anything."""
    from warcore.core import validate_name

    try:
        validate_name("name", name)
    except ValueError:
        return False
    return True


def _misnamed() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # the scanner's own sample, below
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, what, name in offered_names(tree):
            if name.startswith((PREFIX, f"{PREFIX}field")) or name in OURS or not _valid(name):
                continue
            found.append(f"{path.relative_to(TESTS.parent)}:{line}: {what} {name!r}")
    return found


def test_every_fixture_name_has_the_reserved_prefix() -> None:
    misnamed = _misnamed()
    assert not misnamed, f"fixture names without {PREFIX!r}:\n" + "\n".join(misnamed)


def test_the_scan_finds_what_it_must() -> None:
    """The scan is not vacuous: it sees each kind of name, in code and in module sources."""
    source = '''
import warcore
from tests import fake

class Mine:
    name = "mine"

def hooks():
    pm.register(object(), name="held")
    fresh_manager(("paired", object()), entry_points=False)
    fake.add("good", "x = 1", dist="warcore-fake-good")
    fake.add("inner", """
import warcore

@warcore.hookimpl
def warcore_attention_backends():
    return [warcore.BackendSpec("twin", None)]
""")
    return [warcore.AlgorithmSpec("medusa", "medusa"), warcore.FlagSpec("my_flag", bool, False)]
'''
    names = {(what, name) for _, what, name in offered_names(ast.parse(source))}
    assert names == {
        ("Mine.name", "mine"),
        ("registered plugin", "held"),
        ("registered plugin", "paired"),
        ("fake entry point", "good"),
        ("fake entry point", "inner"),
        ("BackendSpec (in a module's source)", "twin"),
        ("AlgorithmSpec", "medusa"),
        ("FlagSpec", "my_flag"),
    }


def _installed_offers() -> set[str]:
    """What the installed plugins offer, asked of their own hooks (the core's resolver is not
    the thing checked here)."""
    names: set[str] = set()
    for ep in md.entry_points(group="warcore"):
        names.add(ep.name)
        try:
            plugin = ep.load()
        except Exception:  # a broken plugin (the matrix's broken cell) offers nothing
            continue
        for hook in ("warcore_attention_backends", "warcore_speculative_algorithms"):
            function = getattr(plugin, hook, None)
            if callable(function):
                names |= {spec.name for spec in function() or ()}
    return names


@pytest.mark.installed
def test_no_installed_plugin_uses_the_reserved_prefix() -> None:
    taken = sorted(n for n in _installed_offers() if n.startswith(PREFIX))
    if taken:
        pytest.fail(f"installed plugins use the fixture prefix {PREFIX!r}: {taken}")
