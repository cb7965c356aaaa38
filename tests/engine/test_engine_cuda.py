"""The engine and runners on a real GPU (skipped without one): the same checks as on sim."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from warcore import ForwardMode, RecordPoint
from warcore.engine import Engine, EngineConfig, ModelConfig, RunReport, synthetic_trace

pytestmark = pytest.mark.cuda

TRACE = synthetic_trace(64, seed=5)


def _run(config: EngineConfig) -> RunReport:
    with Engine(config, device="cuda") as engine:
        return engine.run(TRACE)


@pytest.mark.parametrize("backend", ["torch_native", "trtllm_mha"])
@pytest.mark.parametrize("fence", ["fine", "coarse"])
def test_overlap_equals_serial_on_cuda(backend: str, fence: str) -> None:
    serial = _run(EngineConfig(backend=backend, loop="serial"))
    report = _run(EngineConfig(backend=backend, fence=fence))  # type: ignore[arg-type]
    assert report.outputs == serial.outputs
    assert report.rows_reused > 20


def test_captured_graph_plants_the_node() -> None:
    with Engine(EngineConfig(), device="cuda") as engine:
        graph = engine.target.graphs[ForwardMode.DECODE]
        assert graph.node_planted and all(graph.node_planted.values())
        report = engine.run(TRACE)
    decodes = report.forwards[ForwardMode.DECODE]
    assert report.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)] == decodes
    assert report.barriers["fine"] >= decodes


def test_trtllm_prefill_publishes_before_replay_on_cuda() -> None:
    report = _run(EngineConfig(backend="trtllm_mha"))
    extends = report.forwards[ForwardMode.EXTEND]
    assert report.published[(ForwardMode.EXTEND, RecordPoint.PRE_REPLAY)] == extends


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer missing")
def test_flashinfer_backend_matches_serial() -> None:
    model = ModelConfig(dtype=torch.float16, head_dim=64)
    serial = _run(EngineConfig(backend="flashinfer", loop="serial", model=model))
    report = _run(EngineConfig(backend="flashinfer", model=model))
    assert report.outputs == serial.outputs
    decodes = report.forwards[ForwardMode.DECODE]
    assert report.published[(ForwardMode.DECODE, RecordPoint.IN_GRAPH_NODE)] == decodes


def test_in_graph_event_ring_keeps_the_31072_consumer_bound_on_cuda() -> None:
    """The ring of captured nodes on a GPU (written like the sim path; untested without one):
    each slot's graph records its own external event, so the deferred copy wait binds to its
    own forward's record, where the persistent event binds it to the next one's."""
    from warcore.audit.bindings import audit_bindings

    serial = _run(EngineConfig(loop="serial"))
    persistent = _run(EngineConfig(copy_wait="after-next-launch"))
    assert [f.kind for f in audit_bindings(persistent.bindings)] == ["late-binding"]
    with Engine(
        EngineConfig(copy_wait="after-next-launch", in_graph_event="ring"), device="cuda"
    ) as engine:
        graphs = engine.target.graphs[ForwardMode.DECODE]
        assert graphs.depth == 2 and graphs.graph_count == 2 * len(graphs.buckets)
        ring = engine.run(TRACE)
    assert audit_bindings(ring.bindings) == []
    assert ring.outputs == serial.outputs
