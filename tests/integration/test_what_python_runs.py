"""``warcore release`` compares what Python runs (issue 42, item 2): each case below was
reported "nothing changed" (exit 0) or ``gone`` before, and is ``body changed`` or ``moved``
now.

* a name bound twice (a method defined twice in its class, a module function twice): the
  last ``def``, as Python binds it, and as the live check (``engine_code.resolve``) reads it;
* a package ``x/__init__.py`` beside a module ``x.py`` in the wheel: the package;
* a method moved into a base or mixin of its class: ``moved``, naming the base, its row kept
  in the draft where Python now finds it;
* a moved function is found by its digest, never by its name alone.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest
from _support import release_fakes
from _support.release_fakes import AUDITED
from packaging.version import Version

from warcore.integration import engine_code, source_code
from warcore.integration.release_diff import Comparison, Status, compare
from warcore.integration.releases import Engine, Release
from warcore.integration.wheel import SourceTree, Wheel

pytestmark = pytest.mark.isolated

MODULE = "eng.runner"
ROWS = release_fakes.rows()
ENGINE = Engine(
    "wctest_engine",
    "wctest-engine",
    {"1.0": Release("1.0", {MODULE: ROWS}, {MODULE: "runner"})},
    "wctest_engine.releases",
)
WHEEL = Wheel(Path("wctest_engine-1.1-py3-none-any.whl"), "wctest-engine", Version("1.1"), "0" * 64)
OTHER_CODE = "    return 'other code'\n"


def _compare(sources: dict[str, str], packages: frozenset[str] = frozenset()) -> Comparison:
    return compare(ENGINE, WHEEL, SourceTree(sources, packages), ENGINE.releases["1.0"])


def _statuses(comparison: Comparison) -> dict[str, str]:
    return {row.qualname: row.status for row in comparison.rows}


def _drafted(comparison: Comparison) -> Release:
    namespace: dict[str, object] = {"_1_0": ENGINE.releases["1.0"]}
    exec(comparison.draft(), namespace)  # the printed draft, as the data module takes it
    drafted = namespace["_1_1"]
    assert isinstance(drafted, Release)
    return drafted


def test_the_audited_source_itself_is_unchanged() -> None:
    """The control for every case below."""
    comparison = _compare({MODULE: AUDITED})
    assert _statuses(comparison) == {"Runner.execute": "unchanged", "get_spec": "unchanged"}
    assert comparison.exit_status == 0


# -- the last binding ----------------------------------------------------------------------


TWICE = (
    AUDITED.replace(
        "        return batch + 1\n",
        "        return batch + 1\n\n    def execute(self, batch):\n        return batch - 1\n",
    )
    + "\n\ndef get_spec(name):\n"
    + OTHER_CODE
)


def test_a_method_and_a_function_defined_twice_are_read_at_their_last_def() -> None:
    """The first ``def`` of each is the audited one; Python binds the second."""
    assert TWICE.count("def execute") == 2 and TWICE.count("def get_spec") == 2
    comparison = _compare({MODULE: TWICE})
    assert _statuses(comparison) == {"Runner.execute": "body changed", "get_spec": "body changed"}
    assert comparison.exit_status == 1


def test_the_live_check_reads_the_same_last_def(tmp_path: Path) -> None:
    """What the integration checks where the module is imported (``resolve`` then ``digest``)
    is what the source comparison reads: the same digest, a property's setter keeping its
    getter."""
    source = TWICE + (
        "\n\nclass Holder:\n    @property\n    def value(self):\n        return 1\n\n"
        "    @value.setter\n    def value(self, new):\n        pass\n"
    )
    path = tmp_path / "wctest_twice.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("wctest_twice", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wctest_twice"] = module
    try:
        spec.loader.exec_module(module)
        for qualname in ("Runner.execute", "get_spec", "Holder.value"):
            live = engine_code.digest(engine_code.resolve(module, qualname))
            assert engine_code.audit_in_source(source, qualname)[1] == live, qualname
    finally:
        del sys.modules["wctest_twice"]
    assert module.Runner().execute(1) == 0  # the second def is what runs


def test_a_name_rebound_by_an_assignment_is_no_longer_that_def() -> None:
    rebound = AUDITED + "\n\nget_spec = dict\n"
    assert _statuses(_compare({MODULE: rebound}))["get_spec"] == "gone"


def test_module_bindings_are_the_last_but_a_fallback_import_is_not() -> None:
    tree = source_code.parse(
        "X = 1\nX = 2\n"
        "try:\n    from fast import Y\nexcept ImportError:\n    Y = None\n"
        "class C:\n    pass\nclass C(int):\n    pass\n"
    )
    found = source_code.bindings(tree.body)
    assert found["X"].kind == "value" and getattr(found["X"].node, "value", None) == 2
    assert found["Y"].kind == "from" and found["Y"].target == "fast"
    node = source_code.find_class(tree, "C")
    assert node is not None and [source_code.dotted(b) for b in node.bases] == ["int"]


# -- a package before a module of the same name ---------------------------------------------


@pytest.mark.parametrize("package_first", [True, False], ids=["package-first", "module-first"])
def test_a_package_beside_a_module_of_the_same_name_is_what_is_read(
    tmp_path: Path, package_first: bool
) -> None:
    """``eng/runner/__init__.py`` beside ``eng/runner.py`` (the audited code): Python imports
    the package, whichever the zip lists first."""
    members = [("eng/runner.py", AUDITED), ("eng/runner/__init__.py", TWICE)]
    path = tmp_path / "wctest_engine-1.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members[::-1] if package_first else members:
            archive.writestr(name, text)
    tree = SourceTree.of_wheel(path)
    assert tree.source(MODULE) == TWICE
    comparison = compare(ENGINE, WHEEL, tree, ENGINE.releases["1.0"])
    assert _statuses(comparison) == {"Runner.execute": "body changed", "get_spec": "body changed"}


# -- a method moved into a base of its class ----------------------------------------------------

MIXIN = "eng.mixins"
MOVED_TO_MIXIN = {
    MODULE: "from .mixins import ExecuteMixin as Base\n\n\nclass Runner(Base):\n    pass\n\n\n"
    "def get_spec(name):\n    return {'name': name}\n",
    MIXIN: "class Unrelated:\n    def execute(self, batch):\n    " + OTHER_CODE + "\n\n"
    "class ExecuteMixin:\n    def execute(self, batch):\n        return batch + 1\n",
}


def test_a_method_moved_into_a_base_is_moved_naming_the_base_and_its_row_kept() -> None:
    comparison = _compare(MOVED_TO_MIXIN)
    (row,) = [row for row in comparison.rows if row.qualname == "Runner.execute"]
    assert row.status == Status.MOVED
    assert row.detail() == f"now in {MIXIN} as ExecuteMixin.execute, a base of Runner"
    assert row.found == ROWS["Runner.execute"]  # the same code, now inherited
    drafted = _drafted(comparison)
    assert drafted.functions == {
        MODULE: {"get_spec": ROWS["get_spec"]},
        MIXIN: {"ExecuteMixin.execute": ROWS["Runner.execute"]},
    }


def test_the_base_found_is_the_first_in_method_resolution_order() -> None:
    """``class Runner(Left, Right)``, both deriving from ``Root``, which defines it, and
    ``Right`` overriding it: Python finds ``Right``'s (C3: Runner, Left, Right, Root), a
    depth-first search would take ``Root``'s."""
    sources = {
        MODULE: "class Root:\n    def execute(self, batch):\n    " + OTHER_CODE + "\n"
        "class Left(Root):\n    pass\n\n"
        "class Right(Root):\n    def execute(self, batch):\n        return batch + 1\n\n"
        "class Runner(Left, Right):\n    pass\n",
    }
    tree = SourceTree(sources, frozenset())
    assert tree.inherited(MODULE, "Runner.execute") == (MODULE, "Right.execute")
    comparison = _compare(sources)
    (row,) = [row for row in comparison.rows if row.qualname == "Runner.execute"]
    assert row.status == Status.MOVED and row.found == ROWS["Runner.execute"]
    assert row.detail() == f"now in {MODULE} as Right.execute, a base of Runner"
    assert _drafted(comparison).functions[MODULE]["Right.execute"] == ROWS["Runner.execute"]
    assert "Runner.execute" not in _drafted(comparison).functions[MODULE]


def test_a_method_moved_into_a_base_and_changed_says_both() -> None:
    sources = dict(MOVED_TO_MIXIN)
    sources[MIXIN] = sources[MIXIN].replace("return batch + 1", "return batch + 2")
    (row,) = [r for r in _compare(sources).rows if r.qualname == "Runner.execute"]
    assert row.status == Status.MOVED
    assert row.detail().startswith(f"now in {MIXIN} as ExecuteMixin.execute, a base of Runner;")
    assert f"digest {ROWS['Runner.execute'][1]} -> " in row.detail()


def test_a_class_deriving_from_itself_ends() -> None:
    """A hostile hierarchy (``A(B)``, ``B(A)``): no method found, no endless search."""
    sources = {MODULE: "class A(B):\n    pass\n\nclass B(A):\n    pass\n\nRunner = A\n"}
    assert SourceTree(sources, frozenset()).inherited(MODULE, "A.execute") is None


# -- a moved function, found by its digest ----------------------------------------------------


def test_another_function_of_the_same_name_elsewhere_is_not_it() -> None:
    """``get_spec`` leaves the module; ``eng.other`` defines a different ``get_spec``."""
    sources = {
        MODULE: AUDITED.split("\n\ndef get_spec")[0],
        "eng.other": "def get_spec(name):\n" + OTHER_CODE,
    }
    comparison = _compare(sources)
    (row,) = [r for r in comparison.rows if r.qualname == "get_spec"]
    assert row.status == Status.GONE
    assert row.detail() == "none has its audited code; other code of that name: eng.other"
    assert "get_spec" not in _drafted(comparison).functions.get(MODULE, {})
    assert "eng.other" not in _drafted(comparison).functions


def test_a_moved_function_is_the_one_with_its_digest() -> None:
    sources = {
        MODULE: AUDITED.split("\n\ndef get_spec")[0],
        "eng.a_other": "def get_spec(name):\n" + OTHER_CODE,  # listed first: not it
        "eng.specs": "def get_spec(name):\n    return {'name': name}\n",
    }
    comparison = _compare(sources)
    (row,) = [r for r in comparison.rows if r.qualname == "get_spec"]
    assert row.status == Status.MOVED and row.moved_to == ("eng.specs",)
    assert _drafted(comparison).functions["eng.specs"] == {"get_spec": ROWS["get_spec"]}
