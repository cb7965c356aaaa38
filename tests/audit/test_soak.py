"""The soak command, bounded: clean on honest declarations, and able to fail."""

from __future__ import annotations

import pytest
from _support.engine import deepseek_verify_manager

from warcore import SharedReadBoundary
from warcore.audit.soak import soak

pytestmark = pytest.mark.plugins()


@pytest.mark.slow
def test_a_bounded_soak_is_clean() -> None:
    report = soak(120, seed=3)
    assert report.steps >= 120 and report.segments >= 2
    assert report.forwards_checked > 0
    assert report.clean, report.format()


@pytest.mark.slow
def test_the_soak_catches_an_early_declaration() -> None:
    pm = deepseek_verify_manager(SharedReadBoundary.IN_REPLAY)
    report = soak(30, seed=0, pm=pm)  # the first combination is deepseek_v4 / dflash
    assert report.violations and report.mismatches, report.format()
    assert not report.clean


@pytest.mark.slow
def test_a_bounded_soak_with_the_host_kv_tier_is_clean_and_loads_back() -> None:
    report = soak(60, seed=3, hicache=True)
    assert report.prefix_hits > 0 and report.tokens_shared > 0 and report.copies_checked > 0
    assert report.device_evictions > 0 and report.tokens_loaded > 0  # the pool is under pressure
    assert "prefix cache" in report.format()
    assert report.clean, report.format()
