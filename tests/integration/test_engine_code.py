"""The engine-code checks integrations run before patching: the digest sees code and nothing
else, the signature is the one written, and a source read without importing it gives the
same as the live function."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from warcore.integration import engine_code

# pure inspection of this file's own functions: no plugin, no process
pytestmark = pytest.mark.isolated

_ORIGINAL = '''
def decide(self, fm):
    """Where the reads end."""
    if fm.is_decode() or fm.is_target_verify():
        return Ends.IN_REPLAY
    return Ends.UNKNOWN
'''
_REFORMATTED = '''
def decide(self, fm):
    # a comment, another docstring, other line breaks: the same code
    """Another docstring."""
    if (fm.is_decode()
            or fm.is_target_verify()):   # why
        return Ends.IN_REPLAY

    return Ends.UNKNOWN
'''
_CHANGED = '''
def decide(self, fm):
    """Where the reads end."""
    if fm.is_decode():
        return Ends.IN_REPLAY
    return Ends.UNKNOWN
'''


def _load(tmp_path: Path, name: str, source: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name).decide
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_the_digest_sees_code_not_comments_docstrings_or_formatting(tmp_path: Path) -> None:
    original = engine_code.digest(_load(tmp_path, "wctest_original", _ORIGINAL))
    assert engine_code.digest(_load(tmp_path, "wctest_reformatted", _REFORMATTED)) == original
    assert engine_code.digest(_load(tmp_path, "wctest_changed", _CHANGED)) != original
    assert engine_code.audit_in_source(_ORIGINAL, "decide") == ("(self, fm)", original)


class _Runner:
    def __init__(self) -> None:
        self.marker = None

    def plant(self) -> None:
        self.marker: Any = object()

    def compare(self) -> bool:
        return self.marker == None  # noqa: E711  (a comparison, not an assignment)

    @property
    def planted(self) -> bool:
        return self.marker is not None


def test_assigns_finds_the_methods_that_set_an_attribute_and_calls_the_calls() -> None:
    assert engine_code.assigns(_Runner, "marker") == {"__init__", "plant"}
    assert engine_code.calls(_Runner.compare, "compare") is False
    assert engine_code.calls(
        test_assigns_finds_the_methods_that_set_an_attribute_and_calls_the_calls, "assigns"
    )


def test_resolve_names_what_is_missing_and_unwraps_a_patch() -> None:
    module = sys.modules[__name__]
    original = _Runner.plant

    def patched(self: Any) -> None:
        original(self)

    patched.__warcore_original__ = original  # type: ignore[attr-defined]
    _Runner.plant = patched  # type: ignore[method-assign]
    try:
        assert engine_code.resolve(module, "_Runner.plant") is original
        assert engine_code.resolve(module, "_Runner.planted") is vars(_Runner)["planted"].fget
        try:
            engine_code.resolve(module, "_Runner.gone")
        except engine_code.ShapeMismatch as exc:
            assert exc.check == "_Runner.gone" and "not defined" in exc.detail
        else:
            raise AssertionError("a missing function must be a ShapeMismatch")
    finally:
        _Runner.plant = original  # type: ignore[method-assign]
    assert engine_code.signature(_Runner.plant) == "(self)"


class _DecoratedRunner:
    @contextlib.contextmanager
    def staging(self) -> Any:
        self.marker = object()  # inside a functools.wraps wrapper: contextlib's code
        yield

    @staticmethod
    @contextlib.contextmanager
    def elsewhere() -> Any:
        yield


def test_assigns_reads_a_decorated_method_where_it_is_written() -> None:
    """A method a decorator wrapped is read where it is written: read where the wrapper's code
    is (contextlib's), its assignment went unseen, the unsafe side."""
    assert engine_code.assigns(_DecoratedRunner, "marker") == {"staging"}
    assert "self.marker = object()" in engine_code.method_sources(_DecoratedRunner)["staging"]
    assert "def elsewhere" in engine_code.method_sources(_DecoratedRunner)["elsewhere"]


_DECORATED = '''
import contextlib


@contextlib.contextmanager
def guard(self):
    """Staging under the guard."""
    self.event.synchronize()
    try:
        yield
    finally:
        self.event.record()
'''


def test_a_decorated_function_is_digested_where_it_is_written(tmp_path: Path) -> None:
    """``contextmanager``'s wrapper is contextlib's code: the digest must be the function's."""
    (tmp_path / "wctest_decorated.py").write_text(_DECORATED)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("wctest_decorated")
        function = engine_code.resolve(module, "guard")
        audited = engine_code.audit_module_source("wctest_decorated", ["guard"])
        assert audited == {"guard": engine_code.audit_in_source(_DECORATED, "guard")}
        assert (engine_code.signature(function), engine_code.digest(function)) == audited["guard"]
        assert function.__code__.co_filename == contextlib.__file__  # the wrapper's code
        engine_code.check_functions(module, audited, "1.0")
        other = {"guard": ("(self)", "0" * 16)}
        try:
            engine_code.check_functions(module, other, "1.0")
        except engine_code.ShapeMismatch as exc:
            assert exc.check == "code of guard" and "audited 1.0" in exc.detail
        else:
            raise AssertionError("another digest must be a ShapeMismatch")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("wctest_decorated", None)
