"""The structural checks read from source agree with the same checks on the imported module,
kind by kind; the subclass search follows imports as Python does; the comparison names a
moved function where it went, and its draft entry, applied with ``derive``, is the new table.

A small package written here is both imported (the live side) and read as text (the source
side, :class:`~warcore.integration.wheel.SourceTree`): each verdict below is written by hand,
and both sides must give it."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from packaging.version import Version

from warcore.integration import engine_code
from warcore.integration.checks import (
    AssignedOnlyIn,
    Attributes,
    Calls,
    CallsWith,
    Check,
    ClassTree,
    Globals,
    InstanceAttribute,
    Members,
    NotRedefined,
    ReturnsList,
)
from warcore.integration.release_diff import BadInput, Status, choose_base, compare
from warcore.integration.releases import Engine, Release
from warcore.integration.wheel import SourceTree, Wheel

# modules this file writes, imported and read as text: no plugin, no process
pytestmark = pytest.mark.isolated

PKG = "wctest_relpkg"

_SOURCES = {
    f"{PKG}": "from .base import Runner\n",
    f"{PKG}.settings": """
        class EnvBool:
            def __init__(self, default):
                self.default = default

        class BaseEnvs:
            INHERITED = EnvBool(False)

        class Envs(BaseEnvs):
            FORCE_COARSE = EnvBool(False)

            def __init__(self):
                self.made_in_init = True

        envs = Envs()
    """,
    f"{PKG}.base": """
        from __future__ import annotations

        from enum import Enum, auto
        from typing import TYPE_CHECKING

        from .settings import envs

        if TYPE_CHECKING:
            from .settings import EnvBool

        class Ends(Enum):
            PRE = 1
            IN = 2

            @staticmethod
            def latest(items):
                return max(items, key=lambda x: x.value)

        class Algo(Enum):
            FIRST = auto()
            SECOND = auto()

        class Runner:
            shared = None  # a class attribute

            def __init__(self):
                self.attn = None
                self.event = None

            def execute(self):
                ends = self._resolve(self._backend())
                self.publish(ends)

            def _backend(self):
                return self.attn

            def _resolve(self, backend):
                return backend

            def publish(self, ends):
                self.event = ends

            def message(self):
                if self.event is None:
                    return [b"none", b"0"]
                return [b"event", str(self.event).encode()]
    """,
    f"{PKG}.workers": """
        from . import base as b
        from .base import Runner as R

        class Planting(R):
            def plant(self):
                self.attn = object()

        class Deeper(Planting):
            def execute(self):
                self._resolve(self.attn)

        class Redefining(b.Runner):
            def _backend(self):
                return None
    """,
    f"{PKG}.elsewhere": """
        from wctest_relpkg import Runner
        from .workers import *

        class ThroughPackage(Runner):
            pass

        class ThroughStar(Deeper):
            pass

        def execute():
            return None
    """,
}


def _source(module: str) -> str:
    return textwrap.dedent(_SOURCES[module]).lstrip()


@pytest.fixture(scope="module")
def tree() -> SourceTree:
    return SourceTree({m: _source(m) for m in _SOURCES}, frozenset({PKG}))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = tmp_path_factory.mktemp("live")
    for module in _SOURCES:
        path = root.joinpath(*module.split("."))
        path = path / "__init__.py" if module == PKG else path.with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_source(module))
    sys.path.insert(0, str(root))
    try:
        for module in _SOURCES:  # every subclass imported: the live tree sees them all
            importlib.import_module(module)
        yield sys.modules[f"{PKG}.base"]
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
            del sys.modules[name]


def _verdict(run: object, *args: object) -> str | None:
    """``None`` if the check holds, else the name the failure gives."""
    try:
        run(*args)  # type: ignore[operator]
    except engine_code.ShapeMismatch as exc:
        return exc.check
    return None


_TREE = "Runner and its subclasses"
CASES: list[tuple[Check, str | None]] = [
    (Members("Ends", {"PRE": 1, "IN": 2}), None),
    (Members("Ends", {"PRE": 1, "IN": 3}), "Ends members"),
    (Members("Ends", frozenset({"PRE", "IN", "POST"})), "Ends members"),
    (Members("Algo", {"FIRST": 1, "SECOND": 2}), None),  # auto() numbers from 1
    (Members("Algo", frozenset({"FIRST", "SECOND"})), None),
    (Globals(("Runner", "Ends", "envs", "auto")), None),
    (Globals(("Runner", "EnvBool")), "module global EnvBool"),  # imported for typing only
    (Attributes("envs", ("FORCE_COARSE", "INHERITED", "made_in_init")), None),
    (Attributes("envs", ("FORCE_COARSE", "FORCE_PREFILL")), "envs attributes"),
    (Calls("Runner.execute", "_resolve"), None),
    (Calls("Runner.execute", "_snapshot"), "Runner.execute"),
    (ReturnsList("Runner.message", 2), None),
    (ReturnsList("Runner.message", 3), "Runner.message returns 3 items"),
    (ReturnsList("Ends.latest", 1), "Ends.latest returns 1 items"),  # not a list display
    (InstanceAttribute("Runner", "event"), None),
    (InstanceAttribute("Runner", "shared"), "Runner.shared"),
    (ClassTree("Runner", (AssignedOnlyIn("event", frozenset({"__init__", "publish"})),)), None),
    (
        ClassTree(
            "Runner",
            (AssignedOnlyIn("event", frozenset({"__init__", "publish"}), exact_on_base=True),),
        ),
        None,
    ),
    (
        ClassTree(
            "Runner", (AssignedOnlyIn("event", frozenset({"__init__"}), exact_on_base=True),)
        ),
        "Runner.event",
    ),
    (
        ClassTree("Runner", (AssignedOnlyIn("attn", frozenset({"__init__"}), frozenset()),)),
        "Planting.attn",
    ),
    (ClassTree("Runner", (NotRedefined("publish"),)), None),
    (ClassTree("Runner", (NotRedefined("_backend"),)), "Redefining._backend"),
    (ClassTree("Runner", (CallsWith("_resolve", "self._backend()"),)), "Deeper.execute"),
    (ClassTree("Algo", (CallsWith("_resolve", "self._backend()"),)), None),
]


@pytest.mark.parametrize(("check", "failure"), CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_each_check_kind_gives_the_same_verdict_on_source_and_on_the_module(
    check: Check, failure: str | None, tree: SourceTree, live: ModuleType
) -> None:
    assert _verdict(check.live, live) == failure
    in_source = _verdict(check.in_source, tree, f"{PKG}.base")
    if isinstance(check, ClassTree) and failure is not None:
        # the source side names the whole tree and, inside, each failing class
        assert in_source == _TREE
    else:
        assert in_source == failure


def test_a_class_tree_on_source_names_every_failing_class_with_its_module(
    tree: SourceTree,
) -> None:
    check = ClassTree("Runner", (AssignedOnlyIn("attn", frozenset({"__init__"}), frozenset()),))
    with pytest.raises(engine_code.ShapeMismatch) as failed:
        check.in_source(tree, f"{PKG}.base")
    detail = failed.value.detail
    assert "Planting.attn" in detail and f"(in {PKG}.workers)" in detail
    assert "Runner.attn" not in detail  # the root's __init__ is allowed


def test_a_module_the_release_lacks_fails_every_check_naming_it(tree: SourceTree) -> None:
    for check in (Globals(("x",)), Members("Ends", frozenset()), Calls("f", "g")):
        with pytest.raises(engine_code.ShapeMismatch) as failed:
            check.in_source(tree, f"{PKG}.gone")
        assert failed.value.check == f"module {PKG}.gone"


def test_subclasses_are_found_through_aliases_relative_imports_reexports_and_stars(
    tree: SourceTree,
) -> None:
    found = set(tree.subclasses(f"{PKG}.base", "Runner"))
    assert found == {
        (f"{PKG}.workers", "Planting"),  # from .base import Runner as R
        (f"{PKG}.workers", "Redefining"),  # from . import base as b; b.Runner
        (f"{PKG}.workers", "Deeper"),  # through Planting
        (f"{PKG}.elsewhere", "ThroughPackage"),  # the package's __init__ re-exports it
        (f"{PKG}.elsewhere", "ThroughStar"),  # Deeper, from .workers import *
    }
    assert tree.subclasses(f"{PKG}.workers", "Deeper") == [(f"{PKG}.elsewhere", "ThroughStar")]
    assert tree.locate(f"{PKG}.elsewhere", "Deeper") == (f"{PKG}.workers", "Deeper")
    assert tree.locate(f"{PKG}.workers", "b.Runner") == (f"{PKG}.base", "Runner")


def test_a_missing_class_is_a_lookup_error_not_stop_iteration() -> None:
    with pytest.raises(LookupError):
        engine_code.audit_in_source("def f():\n    pass\n", "Missing.f")


# -- the comparison: nearest release, moved and signature-only rows, the draft ----------------

_NEW = {
    "eng.a": "def build(x, y):\n    return x + y\n\ndef kept():\n    return 1\n",
    "eng.b": "class Runner:\n    def execute(self):\n        return 2\n",
    "eng.c": "",
}
_OLD = {
    "eng.a": {
        # moves to eng.b as it was: found there by its digest (tests/integration/
        # test_what_python_runs.py: other code of its name elsewhere is not it)
        "Runner.execute": engine_code.audit_in_source(_NEW["eng.b"], "Runner.execute"),
        "build": ("(x)", ""),  # signature only: its new signature, still signature only
        "kept": ("()", ""),
    },
    "eng.c": {"gone": ("()", "1" * 16)},
}


def _engine(*versions: str) -> Engine:
    releases = {v: Release(v, _OLD, {"eng.a": "step", "eng.d": "other step"}) for v in versions}
    return Engine("wctest_engine", "wctest-engine", releases, "wctest_engine.releases")


def test_the_nearest_audited_release_is_the_highest_at_or_below_else_the_lowest_above() -> None:
    engine = _engine("0.5.3", "0.5.21", "0.5.22")  # "0.5.3" > "0.5.21" as strings, not versions
    nearest = {v: choose_base(engine, Version(v), None).version for v in ("0.5.22.post1", "0.5.30")}
    assert nearest == {"0.5.22.post1": "0.5.22", "0.5.30": "0.5.22"}
    assert choose_base(engine, Version("0.5.4"), None).version == "0.5.3"
    assert choose_base(engine, Version("0.5.20"), None).version == "0.5.3"
    assert choose_base(engine, Version("0.5.1"), None).version == "0.5.3"
    assert choose_base(engine, Version("0.5.1"), "0.5.21").version == "0.5.21"
    with pytest.raises(BadInput, match=r"--against 0\.5\.9 is not an audited release"):
        choose_base(engine, Version("0.5.1"), "0.5.9")


def test_a_moved_function_is_named_where_it_went_and_the_draft_derives_the_new_table() -> None:
    engine = _engine("1.0")
    wheel = Wheel(
        Path("wctest_engine-1.1-py3-none-any.whl"), "wctest-engine", Version("1.1"), "ab" * 32
    )
    comparison = compare(engine, wheel, SourceTree(_NEW, frozenset()), engine.releases["1.0"])
    statuses = {(row.module, row.qualname): row.status for row in comparison.rows}
    assert statuses == {
        ("eng.a", "Runner.execute"): Status.MOVED,
        ("eng.a", "build"): Status.SIGNATURE,
        ("eng.a", "kept"): Status.UNCHANGED,
        ("eng.c", "gone"): Status.GONE,
    }
    moved = next(row for row in comparison.rows if row.status == Status.MOVED)
    assert moved.moved_to == ("eng.b",)
    assert comparison.missing_watched == ("eng.d",) and comparison.exit_status == 1
    namespace: dict[str, object] = {"_1_0": engine.releases["1.0"]}
    exec(comparison.draft(), namespace)  # the printed draft, as the data module takes it
    drafted = namespace["_1_1"]
    assert isinstance(drafted, Release) and drafted.version == "1.1"
    moved_digest = engine_code.audit_in_source(_NEW["eng.b"], "Runner.execute")[1]
    assert drafted.functions == {
        "eng.a": {"build": ("(x, y)", ""), "kept": ("()", "")},
        "eng.b": {"Runner.execute": ("(self)", moved_digest)},
    }
    assert "REVIEW: moved to eng.b" in comparison.draft()
    assert "watched module eng.d" in comparison.draft()
