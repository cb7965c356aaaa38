"""The sanitizer and the tracer on a GPU: the poison captured into the sanitizer graph at the
in-graph node, and flashinfer (CUDA only). Skipped without a CUDA device."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from _support.audit import TINY_MODEL, backend_class

from warcore import ForwardMode, RecordPoint, SharedReadBoundary
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.sanitizer import sanitize
from warcore.audit.tracer import trace_reads
from warcore.testing import DeclaredBackend, make_plugin_manager

pytestmark = pytest.mark.cuda

CUDA: dict[str, Any] = {"device": "cuda", "requests": 4, "max_running": 2, "num_draft": 2}
RUNS = 10


def test_torch_native_is_sound_and_an_early_decode_is_flagged_on_cuda() -> None:
    pm = make_plugin_manager()
    for _ in range(RUNS):
        report = sanitize("torch_native", "none", pm=pm, model=TINY_MODEL, **CUDA)
        assert report.sound, report.format()
        decode = next(m for m in report.modes if m.mode is ForwardMode.DECODE)
        assert decode.record_points.keys() == {RecordPoint.IN_GRAPH_NODE}
    early = DeclaredBackend(TorchNativeBackend, {ForwardMode.DECODE: SharedReadBoundary.PRE_REPLAY})
    pm = make_plugin_manager(early, builtins="algorithms")
    for _ in range(RUNS):
        report = sanitize("torch_native", "none", pm=pm, model=TINY_MODEL, **CUDA)
        assert report.violation is not None, report.format()


@pytest.mark.plugins("deepseek_v4", "dflash")
def test_the_sanitizer_graph_poisons_at_the_in_graph_node_on_cuda() -> None:
    """deepseek_v4's verify declared IN_REPLAY: the poison runs inside the captured probe
    graph, right after the node, and the later layers' reads see it, every time."""
    plugin = DeclaredBackend(
        backend_class("deepseek_v4"), {ForwardMode.TARGET_VERIFY: SharedReadBoundary.IN_REPLAY}
    )
    pm = make_plugin_manager(plugin, entry_points=["dflash"], builtins="algorithms")
    for _ in range(RUNS):
        report = sanitize("deepseek_v4", "dflash", pm=pm, model=TINY_MODEL, **CUDA)
        v = report.violation
        assert v is not None, report.format()
        assert v.record_point is RecordPoint.IN_GRAPH_NODE
        assert v.forward_mode is ForwardMode.TARGET_VERIFY


def test_the_tracer_on_cuda() -> None:
    trace = trace_reads("torch_native", "none", device="cuda", model=TINY_MODEL)
    assert trace.last_shared_read(ForwardMode.DECODE) == "in-graph init"


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer")
def test_flashinfer_declarations() -> None:
    """flashinfer's decode gathers the page table in its plan (out-graph init): sound as
    declared (the contract's IN_REPLAY) and at PRE_REPLAY too; its prefill (the portable path,
    in-graph gather) declared PRE_REPLAY is flagged every time."""
    from warcore.attention.flashinfer import FlashInferBackend

    fp16: dict[str, Any] = {**CUDA, "max_running": 4, "dtype": torch.float16}
    pm = make_plugin_manager()
    assert sanitize("flashinfer", "none", pm=pm, **fp16).sound
    pre = {ForwardMode.DECODE: SharedReadBoundary.PRE_REPLAY}
    pm = make_plugin_manager(DeclaredBackend(FlashInferBackend, pre, name="flashinfer_pre"))
    assert sanitize("flashinfer_pre", "none", pm=pm, **fp16).sound
    early = {**pre, ForwardMode.EXTEND: SharedReadBoundary.PRE_REPLAY}
    pm = make_plugin_manager(DeclaredBackend(FlashInferBackend, early, name="flashinfer_early"))
    for _ in range(RUNS):
        report = sanitize("flashinfer_early", "none", pm=pm, **fp16)
        assert report.violation is not None and report.violation.forward_mode is ForwardMode.EXTEND
