"""Closing an engine releases what the process-wide caches held of it."""

from __future__ import annotations

import gc
import weakref

import pytest

from warcore.core import DecisionCache, get_decision_cache, get_plugin_manager
from warcore.engine import Engine, EngineConfig, synthetic_trace

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic


def _entries_of(backend: object) -> list[object]:
    cache = get_decision_cache(get_plugin_manager())
    keys = [DecisionCache._keys.get(k) if isinstance(k, int) else k for k in cache]
    handles = [k for k in DecisionCache._keys.values() if k[1] is backend]
    return [k for k in keys if k is not None and k[1] is backend] + handles


def test_a_closed_engine_is_not_kept_alive_by_the_decision_cache() -> None:
    with Engine(EngineConfig(), device="sim") as engine:
        engine.run(synthetic_trace(3, seed=1))
        backend = engine.runner.backend
        assert _entries_of(backend), "the engine's decisions are resolved through the shared cache"
        ref = weakref.ref(engine.pool)
    assert not _entries_of(backend)
    del engine, backend
    gc.collect()
    assert ref() is None
