"""acme's tests, written with warcore.testing: installed, declarations sound, and audited.

The kit is an opt-in pytest plugin; this distribution enables it in its pyproject.toml
(``addopts = "-p warcore.testing"``). ``pytest_plugins = ["warcore.testing"]`` in the
``conftest.py`` at your rootdir does the same.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest
from warcore_acme import BACKEND_NAME, BOUNDARIES
from warcore_acme.backend import AcmeBackend

from warcore import ForwardMode, SharedReadBoundary
from warcore.audit.tracer import trace_reads
from warcore.batch import ForwardBatch
from warcore.core import WarcorePluginManager, get_registry, resolve_shared_read_boundary
from warcore.testing import DeclaredBackend, assert_declarations_sound


@pytest.mark.warcore_plugins("acme")
def test_the_plugin_is_installed_and_offers_acme(warcore_pm: WarcorePluginManager) -> None:
    assert BACKEND_NAME in get_registry(warcore_pm).backends
    for mode, boundary in BOUNDARIES.items():
        resolved = resolve_shared_read_boundary(BACKEND_NAME, mode, pm=warcore_pm)
        assert (resolved.boundary, resolved.source) == (boundary, "plugin:acme")


@pytest.mark.warcore_plugins("acme")
def test_every_declaration_is_sound(warcore_pm: WarcorePluginManager) -> None:
    """The conformance check: acme under every algorithm the reference engine runs with the
    core alone (none, eagle)."""
    reports = assert_declarations_sound(backend=BACKEND_NAME, pm=warcore_pm)
    assert {r.algorithm for r in reports} == {"none", "eagle"}
    # PRE_REPLAY everywhere: every prefill and every verify or decode forward was poisoned
    # from its record point on, and nothing changed.
    assert all(r.checked > 0 for r in reports)


@pytest.mark.skipif(
    importlib.util.find_spec("warcore_dflash") is None, reason="the dflash plugin is not installed"
)
@pytest.mark.warcore_plugins("acme", "dflash")
def test_declarations_are_sound_under_dflash_too(warcore_pm: WarcorePluginManager) -> None:
    reports = assert_declarations_sound(backend=BACKEND_NAME, algorithm="dflash", pm=warcore_pm)
    assert [r.algorithm for r in reports] == ["dflash"] and reports[0].checked > 0


@pytest.mark.warcore_plugins("acme")
def test_the_tracer_agrees_reads_end_before_replay(warcore_pm: WarcorePluginManager) -> None:
    trace = trace_reads(BACKEND_NAME, "none", pm=warcore_pm)
    for mode in (ForwardMode.EXTEND, ForwardMode.DECODE):
        reads = trace.mode(mode)
        assert reads.last_phase == "out-graph init"
        assert reads.implied is SharedReadBoundary.PRE_REPLAY
        assert reads.reads_after_point == 0


class GatherInGraph(AcmeBackend):
    """A regression: the page-table gather moved into the in-graph init."""

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        pass

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.gather_page_table(batch)
        self.build_masks(batch)


def test_the_audit_catches_a_regression(
    make_warcore_pm: Callable[..., WarcorePluginManager],
) -> None:
    """Same declarations, code that reads later: the sanitizer must refuse it."""
    pm = make_warcore_pm(DeclaredBackend(GatherInGraph, BOUNDARIES, name="acme_regressed"))
    with pytest.raises(AssertionError, match="VIOLATION.*acme_regressed.*declared PRE_REPLAY"):
        assert_declarations_sound(backend="acme_regressed", algorithm="none", pm=pm)
