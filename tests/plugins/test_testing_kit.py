"""warcore.testing, the opt-in pytest plugin for plugin authors: fixtures, marker, helpers."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from _support.audit import TINY_MODEL

import warcore
from warcore import ForwardMode, SharedReadBoundary
from warcore.attention.torch_native import TorchNativeBackend
from warcore.core import PluginValidationError, WarcorePluginManager, get_registry
from warcore.testing import (
    CoreAlgorithms,
    DeclaredBackend,
    assert_declarations_sound,
    make_plugin_manager,
)

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

pytest_plugins = ["pytester"]

FAST: dict[str, Any] = {"requests": 3, "max_running": 2, "model": TINY_MODEL}


@pytest.mark.plugin_agnostic
def test_managers_hold_only_what_they_are_given() -> None:
    bare = make_plugin_manager()
    registry = get_registry(bare)
    # The core's own backends only (flashinfer where it is installed), no plugin's.
    assert "torch_native" in registry.backends
    assert set(registry.backends) <= {"torch_native", "hybrid", "layer_hybrid", "flashinfer"}
    assert set(registry.algorithms) == {"none", "eagle"}
    assert [info.name for info in bare.plugin_infos] == ["warcore"]

    algorithms_only = make_plugin_manager(builtins="algorithms")
    assert not get_registry(algorithms_only).backends
    assert set(get_registry(algorithms_only).algorithms) == {"none", "eagle"}
    assert not get_registry(make_plugin_manager(builtins="none")).algorithms

    with pytest.raises(LookupError, match="no_such_plugin"):
        make_plugin_manager(entry_points=["no_such_plugin"])
    with pytest.raises(ValueError, match="builtins"):
        make_plugin_manager(builtins="some")  # type: ignore[arg-type]


def test_a_misspelled_hook_is_refused() -> None:
    class Typo:
        @warcore.hookimpl
        def warcore_shared_read_boundry(self, backend: str) -> None:
            return None

    with pytest.raises(PluginValidationError, match="warcore_shared_read_boundry"):
        make_plugin_manager(Typo())


def test_declared_backend_offers_the_class_under_its_declarations() -> None:
    plugin = DeclaredBackend(TorchNativeBackend, {"DECODE": "PRE_REPLAY"}, name="native_copy")
    pm = make_plugin_manager(plugin)
    spec = get_registry(pm).backend("native_copy")
    assert spec.factory is plugin.backend and plugin.backend.name == "native_copy"
    assert issubclass(plugin.backend, TorchNativeBackend)
    assert TorchNativeBackend.name == "torch_native"  # the original is untouched
    resolved = warcore.resolve_shared_read_boundary("native_copy", ForwardMode.DECODE, pm=pm)
    assert resolved.boundary is SharedReadBoundary.PRE_REPLAY
    assert resolved.source == "plugin:DeclaredBackend"
    # Same name as the core's backend: re-offer it next to the core's algorithms only.
    pm = make_plugin_manager(DeclaredBackend(TorchNativeBackend, {}), builtins="algorithms")
    assert set(get_registry(pm).backends) == {"torch_native"}
    assert isinstance(pm.get_plugin("warcore-algorithms"), CoreAlgorithms)


def test_assert_declarations_sound_passes_honest_and_refuses_early() -> None:
    reports = assert_declarations_sound(
        backend="torch_native", algorithm="none", pm=make_plugin_manager(), **FAST
    )
    assert [(r.backend, r.algorithm, r.sound) for r in reports] == [("torch_native", "none", True)]

    early = DeclaredBackend(TorchNativeBackend, {ForwardMode.DECODE: SharedReadBoundary.PRE_REPLAY})
    pm = make_plugin_manager(early, builtins="algorithms")
    with pytest.raises(AssertionError) as failure:
        assert_declarations_sound(backend="torch_native", pm=pm, **FAST)
    message = str(failure.value)
    assert "VIOLATION" in message and "DECODE declared PRE_REPLAY" in message
    # The read tracer says where the read really is, and what that allows.
    assert "last shared read: in-graph init" in message and "allow IN_REPLAY" in message
    # Both algorithms the manager knows were tried; eagle's draft-extend is sound.
    assert "torch_native / none" in message and "torch_native / eagle" not in message


def test_assert_declarations_sound_needs_a_name() -> None:
    with pytest.raises(ValueError, match="backend, an algorithm"):
        assert_declarations_sound(pm=make_plugin_manager())


@pytest.mark.warcore_plugins(builtins="algorithms")
def test_the_marker_configures_warcore_pm(warcore_pm: WarcorePluginManager) -> None:
    assert not get_registry(warcore_pm).backends
    assert "eagle" in get_registry(warcore_pm).algorithms


def test_the_factory_fixture(make_warcore_pm: Callable[..., WarcorePluginManager]) -> None:
    first, second = make_warcore_pm(), make_warcore_pm()
    assert first is not second


_SUITE = """
import pytest
import warcore
from warcore.core import get_plugin_manager, get_registry


class Extra:
    @warcore.hookimpl
    def warcore_speculative_algorithms(self):
        return [warcore.AlgorithmSpec("wctest_extra", "none", "test")]


@pytest.mark.warcore_plugins("dflash")
def test_named(warcore_pm):
    names = set(get_registry(warcore_pm).algorithms)
    assert {"dflash", "dspark", "none", "eagle"} <= names
    assert "trtllm_mha" not in get_registry(warcore_pm).backends


def test_unnamed(warcore_pm):
    core = {"torch_native", "hybrid", "layer_hybrid", "flashinfer"}
    assert set(get_registry(warcore_pm).backends) <= core
    assert set(get_registry(warcore_pm).algorithms) == {"none", "eagle"}


def test_registers(register_for_test):
    register_for_test(Extra())
    assert "wctest_extra" in get_registry(get_plugin_manager()).algorithms


def test_and_unregisters():
    assert "wctest_extra" not in get_registry(get_plugin_manager()).algorithms
"""


@pytest.mark.plugins("dflash")
def test_the_plugin_in_a_pytest_session(pytester: pytest.Pytester) -> None:
    """What an author's suite sees: the fixtures, the registered marker (--strict-markers), and
    a helper that unregisters after its test."""
    pytester.makepyfile(test_kit=textwrap.dedent(_SUITE))
    result = pytester.runpytest("-p", "warcore.testing", "--strict-markers", "-q")
    result.assert_outcomes(passed=4)
