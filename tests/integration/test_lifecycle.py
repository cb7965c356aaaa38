"""The activation life cycle every engine integration shares, on modules the tests write: a
watched module is checked, then patched, where it is imported; "settled" waits for every
module's check; a failed check or patch anywhere puts everything back exactly and says why
once; the checkpoint imports what is pending or names what is gone; the gate admits a release
exactly."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from warcore.integration import Activation, Release, UnsupportedRelease, pick
from warcore.integration.checks import AssignedOnlyIn, ClassTree, Members
from warcore.integration.engine_code import audit_in_source

# an import hook on modules the test writes: no plugin, no process
pytestmark = pytest.mark.isolated

_ENGINE = """
import enum

class Ends(enum.Enum):
    EARLY = 1
    LATE = 2

class Runner:
    def __init__(self):
        self.marker = None

    def decide(self, mode):
        return Ends.EARLY if mode == "decode" else Ends.LATE
"""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A two-module "engine": ``wcengine_outer`` imports ``wcengine_runner`` while it runs."""
    (tmp_path / "wcengine_runner.py").write_text(_ENGINE)
    (tmp_path / "wcengine_outer.py").write_text("import wcengine_runner\nOUTER = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("wcengine_outer", "wcengine_runner"):
        sys.modules.pop(name, None)


def _release(**changes: object) -> Release:
    sig, digest = audit_in_source(_ENGINE, "Runner.decide")
    release = Release(
        "1.0",
        functions={"wcengine_runner": {"Runner.decide": (sig, digest)}},
        watched={"wcengine_outer": "check", "wcengine_runner": "patch"},
        checks={"wcengine_runner": (Members("Ends", {"EARLY": 1, "LATE": 2}),)},
    )
    return release.derive("1.0", **changes)  # type: ignore[arg-type]


def _activation() -> Activation:
    return Activation("wctest", logging.getLogger("wctest"), lambda: "engine 1.0", "its own")


def _patch_decide(activation: Activation) -> object:
    def patch(module: ModuleType) -> None:
        original = vars(module.Runner)["decide"]
        activation.patcher.set(module.Runner, "decide", lambda self, mode: "patched")
        assert vars(module.Runner)["decide"] is not original

    return patch


def test_modules_are_checked_then_patched_and_settled_once_every_check_ran(engine: Path) -> None:
    activation = _activation()
    order: list[str] = []
    steps = {
        "check": lambda module: order.append(f"checked {module.__name__}"),
        "patch": lambda module: order.append(f"patched {module.__name__}"),
    }
    activation.install(_release(), steps, on_settled=lambda why: order.append(f"told {why}"))
    try:
        import wcengine_outer  # noqa: F401  (imports the runner while it runs)

        # the runner's step ran inside the outer module's import, and "settled" waited for
        # the outer module's own check
        assert order == ["patched wcengine_runner", "checked wcengine_outer", "told None"]
        assert activation.settled and not activation.pending
    finally:
        activation.uninstall()


def test_a_module_not_needed_is_no_longer_waited_for_nor_patched(engine: Path) -> None:
    """The engine built another runner than the one a watched module holds: the activation
    settles without that module, and a later import of it is neither checked nor patched."""
    activation = _activation()
    told: list[str | None] = []
    patched: list[str] = []
    steps = {"check": lambda module: None, "patch": lambda module: patched.append(module.__name__)}
    release = _release(watched={"wcengine_runner": "patch", "wcengine_gone": "check"})
    activation.install(release, steps, on_settled=told.append)
    try:
        activation.not_needed("wcengine_nowhere")  # not watched: nothing happens
        assert activation.pending == {"wcengine_runner", "wcengine_gone"} and told == []
        activation.not_needed("wcengine_runner")
        assert activation.pending == {"wcengine_gone"} and told == []
        import wcengine_runner  # noqa: F401

        assert patched == [] and told == []
        activation.not_needed("wcengine_gone")  # the last one: settled
        assert activation.settled and told == [None] and not activation.pending
    finally:
        activation.uninstall()
    activation.not_needed("wcengine_gone")  # not installed: nothing happens


def test_a_failed_check_puts_everything_back_exactly_and_says_why_once(engine: Path) -> None:
    (engine / "wcengine_outer.py").write_text("X = 1\n")
    activation = _activation()
    told: list[str | None] = []
    activation.install(
        _release(checks={"wcengine_runner": (Members("Ends", {"EARLY": 1}),)}),
        {"check": lambda module: None, "patch": _patch_decide(activation)},
        on_settled=told.append,
    )
    import wcengine_outer  # noqa: F401

    assert activation.installed and told == []
    import wcengine_runner  # fails its Members check: taken off before its patch

    assert not activation.installed and activation.degraded_check == "Ends members"
    assert len(told) == 1 and told[0] is not None
    assert told[0].startswith("engine 1.0 differs from the audited 1.0 at Ends members")
    assert told[0].endswith("; its own")
    assert wcengine_runner.Runner().decide("decode") is wcengine_runner.Ends.EARLY


def test_a_patch_is_restored_to_the_very_object_and_an_inherited_one_deleted(
    engine: Path,
) -> None:
    import wcengine_runner

    class Child(wcengine_runner.Runner):
        pass

    original = vars(wcengine_runner.Runner)["decide"]
    activation = _activation()

    def patch(module: ModuleType) -> None:
        activation.patcher.set(module.Runner, "decide", lambda self, mode: "patched")
        activation.patcher.set(Child, "decide", lambda self, mode: "child")

    activation.install(_release(), {"check": lambda m: None, "patch": patch})
    assert Child().decide("decode") == "child"
    assert activation.uninstall() and not activation.uninstall()
    assert vars(wcengine_runner.Runner)["decide"] is original
    assert "decide" not in vars(Child)  # inherited again, not pinned


def test_the_checkpoint_imports_a_pending_module_and_names_one_that_is_gone(
    engine: Path,
) -> None:
    activation = _activation()
    told: list[str | None] = []
    activation.install(
        _release(watched={"wcengine_runner": "check", "wcengine_moved": "check"}),
        {"check": lambda module: None},
        on_settled=told.append,
    )
    assert activation.pending == {"wcengine_runner", "wcengine_moved"}
    activation.checkpoint()
    assert not activation.installed
    assert len(told) == 1 and told[0] is not None and "module wcengine_moved" in told[0]

    told.clear()
    activation.install(
        _release(watched={"wcengine_runner": "check"}),
        {"check": lambda module: told.append(module.__name__)},
    )
    activation.checkpoint()
    assert told == ["wcengine_runner"] and activation.settled


def test_a_class_defined_later_that_fails_a_tree_check_takes_the_activation_off(
    engine: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import wcengine_runner

    activation = _activation()
    told: list[str | None] = []
    tree = ClassTree("Runner", (AssignedOnlyIn("marker", frozenset({"__init__"})),))
    activation.install(
        _release(watched={"wcengine_runner": "check"}, checks={"wcengine_runner": (tree,)}),
        {"check": lambda module: None},
        on_settled=told.append,
    )
    assert told == [None]

    with caplog.at_level(logging.ERROR, logger="wctest"):

        class Replanting(wcengine_runner.Runner):  # the class statement itself never fails
            def reset(self) -> None:
                self.marker = object()

    assert Replanting.__name__ == "Replanting" and not activation.installed
    assert told == [None]  # told once, when it settled; a later take-off is said in the log
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "warcore taken off" in said[0] and "Replanting.marker" in said[0]


def test_the_gate_admits_a_release_exactly() -> None:
    releases = {"1.0": _release()}
    assert pick("engine", "1.0", releases) is releases["1.0"]
    for other in ("1.0.post1", "1.0+local", "1.0.0", "0.9"):
        with pytest.raises(UnsupportedRelease, match=rf"engine {re.escape(other)} is not a rel"):
            pick("engine", other, releases)
    with pytest.raises(UnsupportedRelease, match="engine is not installed"):
        pick("engine", None, releases)


def test_a_derived_release_changes_only_what_it_names() -> None:
    base = _release()
    derived = base.derive(
        "1.1",
        functions={"wcengine_runner": {"Runner.decide": None}, "wcengine_new": {"f": ("()", "")}},
    )
    assert derived.version == "1.1" and derived.watched == base.watched
    assert derived.functions == {"wcengine_new": {"f": ("()", "")}}
    assert base.functions_of("wcengine_runner")  # the base entry is untouched
