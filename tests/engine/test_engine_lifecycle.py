"""Closing an engine releases what the process-wide caches held of it."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from warcore.core import DecisionCache, get_decision_cache, get_plugin_manager
from warcore.engine import Engine, EngineBusy, EngineConfig, RunReport, synthetic_trace

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


def test_a_second_thread_running_one_engine_at_once_is_refused() -> None:
    """Two runs of one engine at once would share its streams, pools and rows, and return
    wrong tokens without an error (issue 27): the second is refused with one clear error and
    the first is served right."""
    trace = synthetic_trace(4, seed=3, output_len=(4, 8))
    with Engine(EngineConfig(loop="serial", fence="coarse"), device="sim") as serial:
        oracle = serial.run(trace).outputs
    running, refused = threading.Event(), threading.Event()
    first: list[RunReport] = []

    def pause_first_run(done: int, total: int) -> None:
        running.set()
        refused.wait(30)  # the first run holds the engine while the second one tries

    with Engine(EngineConfig(), device="sim") as engine:
        thread = threading.Thread(
            target=lambda: first.append(engine.run(trace, progress=pause_first_run))
        )
        thread.start()
        try:
            assert running.wait(30), "the first run never started"
            with pytest.raises(EngineBusy, match="already running"):
                engine.run(trace)
        finally:
            refused.set()
            thread.join(60)
        assert first and first[0].outputs == oracle
        assert engine.run(trace).outputs == oracle  # free again once the first run is done
