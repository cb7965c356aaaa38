"""The post-import hook: a callback runs on a module right after its first import, once, with
the module executed; other imports pass by; the module keeps its source for inspection."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

from warcore.integration.post_import import PostImportFinder

# an import hook on modules the test writes: no plugin, no process
pytestmark = pytest.mark.isolated


def test_the_callback_runs_once_after_the_module_is_executed(tmp_path: Path) -> None:
    (tmp_path / "wctest_late.py").write_text("VALUE = 41\n\ndef value():\n    return VALUE\n")
    (tmp_path / "wctest_other.py").write_text("OTHER = 1\n")
    seen: list[tuple[str, int]] = []

    def patch(module: ModuleType) -> None:
        seen.append((module.__name__, module.VALUE))
        module.VALUE += 1

    finder = PostImportFinder({"wctest_late": patch})
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module("wctest_other")
        assert seen == [] and finder.callbacks.keys() == {"wctest_late"}
        module = importlib.import_module("wctest_late")
        assert seen == [("wctest_late", 41)] and module.value() == 42
        assert finder.callbacks == {}
        assert "return VALUE" in inspect.getsource(module.value)
        importlib.reload(module)  # not a first import: the callback is gone
        assert seen == [("wctest_late", 41)] and module.VALUE == 41
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        for name in ("wctest_late", "wctest_other"):
            sys.modules.pop(name, None)


def test_a_module_that_does_not_exist_is_left_to_the_import_system() -> None:
    finder = PostImportFinder({"wctest_absent": lambda module: None})
    sys.meta_path.insert(0, finder)
    try:
        try:
            importlib.import_module("wctest_absent")
        except ModuleNotFoundError as exc:
            assert exc.name == "wctest_absent"
        else:
            raise AssertionError("an absent module must stay absent")
        assert "wctest_absent" in finder.callbacks
    finally:
        sys.meta_path.remove(finder)


def test_a_spec_found_without_importing_or_a_failed_import_keeps_the_callback(
    tmp_path: Path,
) -> None:
    # importlib.util.find_spec consults the finder without executing anything (an activation's
    # checkpoint does, before importing a pending module): the callback must survive it, and
    # an import that raised half-way, and run on the import that succeeds
    (tmp_path / "wctest_flaky.py").write_text(
        "import os\nif os.environ.get('WCTEST_FAIL'):\n    raise ImportError('not yet')\nV = 1\n"
    )
    seen: list[str] = []
    finder = PostImportFinder({"wctest_flaky": lambda module: seen.append(module.__name__)})
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)
    try:
        assert importlib.util.find_spec("wctest_flaky") is not None
        assert seen == [] and "wctest_flaky" in finder.callbacks
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("WCTEST_FAIL", "1")
            with pytest.raises(ImportError, match="not yet"):
                importlib.import_module("wctest_flaky")
        assert seen == [] and "wctest_flaky" in finder.callbacks
        importlib.import_module("wctest_flaky")
        assert seen == ["wctest_flaky"] and finder.callbacks == {}
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("wctest_flaky", None)
