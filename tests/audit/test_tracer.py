"""The read tracer: where each backend's last shared read is, and what counts as a read."""

from __future__ import annotations

import pytest
import torch
from _support.audit import (
    TINY_MODEL,
    HiddenLateReader,
    OneElementLateReader,
    UndeclaredHiddenReader,
    backend_class,
)

from warcore import ForwardMode, RecordPoint, SharedReadBoundary
from warcore.attention import declare_shared_read
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.sanitizer import engine_config, trace_for
from warcore.audit.tracer import ReadTracer, phase_name, trace_reads, watch_shared_reads
from warcore.engine import Engine
from warcore.engine.model import ModelConfig
from warcore.testing import DeclaredBackend, make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

LAST_LAYER = f"layer {ModelConfig().layers - 1} attention"


@pytest.mark.plugins("trtllm_mha")
def test_trtllm_mha_prefill_reads_last_in_the_out_graph_init() -> None:
    trace = trace_reads("trtllm_mha", "none")
    extend = trace.mode(ForwardMode.EXTEND)
    assert trace.last_shared_read(ForwardMode.EXTEND) == "out-graph init"
    assert extend.last is not None and extend.last.where == "TrtllmMhaBackend.gather_page_table"
    assert extend.implied is SharedReadBoundary.PRE_REPLAY
    assert extend.record_points == {RecordPoint.PRE_REPLAY}
    assert extend.reads_after_point == 0
    # Its decode follows the contract: the gather moves into the in-graph init.
    assert trace.last_shared_read(ForwardMode.DECODE) == "in-graph init"


@pytest.mark.plugin_agnostic
def test_torch_native_decode_reads_last_in_the_in_graph_init() -> None:
    trace = trace_reads("torch_native", "none")
    decode = trace.mode(ForwardMode.DECODE)
    assert trace.last_shared_read(ForwardMode.DECODE) == "in-graph init"
    assert decode.implied is SharedReadBoundary.IN_REPLAY
    # Eager forwards record right after the in-graph init: no read comes after that point.
    assert decode.record_points == {RecordPoint.AFTER_IN_GRAPH_INIT}
    assert decode.reads_after_point == 0
    # Both shared buffers are read, and load_batch reads req_to_token (the slots) too.
    forward = next(f for f in trace.forwards if f.mode is ForwardMode.DECODE)
    assert {(r.label, r.buffer) for r in forward.reads} >= {
        ("load_batch", "req_to_token"),
        ("in_graph_init", "req_to_token"),
        ("in_graph_init", "full_to_swa_index_mapping"),
    }
    assert forward.point_after == forward.launches.index("in_graph_init") + 1


@pytest.mark.plugins("deepseek_v4", "dflash")
def test_deepseek_v4_verify_reads_last_in_the_last_layer() -> None:
    trace = trace_reads("deepseek_v4", "dflash")
    verify = trace.mode(ForwardMode.TARGET_VERIFY)
    assert trace.last_shared_read(ForwardMode.TARGET_VERIFY) == LAST_LAYER
    assert verify.implied is SharedReadBoundary.POST_REPLAY
    assert verify.declared is SharedReadBoundary.POST_REPLAY
    # Every layer re-reads the page table.
    verifies = [f for f in trace.forwards if f.mode is ForwardMode.TARGET_VERIFY]
    layers = {r.label for f in verifies for r in f.reads}
    assert {f"layer{i}" for i in range(ModelConfig().layers)} <= layers
    # Under dspark the verify honours the contract.
    dspark = trace_reads("deepseek_v4", "dspark")
    assert dspark.last_shared_read(ForwardMode.TARGET_VERIFY) == "in-graph init"


@pytest.mark.plugins("deepseek_v4", "dflash")
def test_reads_after_the_record_point_are_counted() -> None:
    """deepseek_v4's verify declared IN_REPLAY: the eager record point comes after the in-graph
    init, and every layer's read lands after it."""
    plugin = DeclaredBackend(
        backend_class("deepseek_v4"), {ForwardMode.TARGET_VERIFY: SharedReadBoundary.IN_REPLAY}
    )
    pm = make_plugin_manager(plugin, entry_points=["dflash"], builtins="algorithms")
    verify = trace_reads("deepseek_v4", "dflash", pm=pm, model=TINY_MODEL).mode(
        ForwardMode.TARGET_VERIFY
    )
    assert verify.record_points == {RecordPoint.AFTER_IN_GRAPH_INIT}
    assert verify.reads_after_point >= verify.forwards * TINY_MODEL.layers
    assert verify.implied is SharedReadBoundary.POST_REPLAY


def test_one_element_read_through_a_view_is_seen() -> None:
    # The contract's default covers captured graphs; the tracer runs eagerly, so the eager
    # decode is declared IN_REPLAY on its own (what the contract promises).
    eager = {ForwardMode.DECODE: SharedReadBoundary.IN_REPLAY}
    pm = make_plugin_manager(DeclaredBackend(OneElementLateReader, {}, eager=eager))
    trace = trace_reads("wctest_one_element", "none", pm=pm, model=TINY_MODEL)
    decode = trace.mode(ForwardMode.DECODE)
    assert decode.last is not None
    assert decode.last_phase == f"layer {TINY_MODEL.layers - 1} attention"
    assert decode.last.where == "OneElementLateReader.forward"
    assert decode.last.after_record_point


def test_reads_outside_the_dispatcher_need_their_declaration() -> None:
    declared = make_plugin_manager(DeclaredBackend(HiddenLateReader, {}))
    trace = trace_reads("wctest_hidden_reader", "none", pm=declared, model=TINY_MODEL)
    last = trace.mode(ForwardMode.DECODE).last
    assert last is not None and last.declared and last.op == "declared:numpy_gather"
    assert last.phase == f"layer {TINY_MODEL.layers - 1} attention"
    # Undeclared, the tracer cannot see it (the sanitizer still catches it: test_sanitizer).
    hidden = make_plugin_manager(DeclaredBackend(UndeclaredHiddenReader, {}))
    trace = trace_reads("wctest_hidden_undeclared", "none", pm=hidden, model=TINY_MODEL)
    assert trace.last_shared_read(ForwardMode.DECODE) == "in-graph init"


def test_what_counts_as_a_read() -> None:
    table = torch.arange(24, dtype=torch.int64).view(4, 6)
    private = torch.zeros(2, 6, dtype=torch.int64)
    with watch_shared_reads({"req_to_token": table}, label="in_graph_init") as reads:
        row = table[1]  # a view: moves no data
        table.index_put_((torch.tensor([0]),), torch.tensor([5]))  # a write, not a read
        torch.index_select(table, 0, torch.tensor([0, 2]), out=private)  # read into out=
        row.sum()  # a read through the view
        private.copy_(table[2:4])  # a read through a slice
        private.add_(1)  # unrelated storage
        declare_shared_read(table[3], "custom_kernel")
    assert [r.op for r in reads] == [
        "aten.index_select.out",
        "aten.sum.default",
        "aten.copy_.default",
        "declared:custom_kernel",
    ]
    assert {r.buffer for r in reads} == {"req_to_token"}
    assert [r.declared for r in reads] == [False, False, False, True]
    assert all(r.phase == "in-graph init" for r in reads)
    declare_shared_read(table, "nobody listening")  # no tracer: a no-op


def test_phase_names() -> None:
    assert phase_name("layer12") == "layer 12"
    assert phase_name("out_graph_init") == "out-graph init"
    assert phase_name("custom") == "custom"


def test_tracing_leaves_the_tokens_alone() -> None:
    """Tracing an engine leaves its tokens alone: the same as a run without the tracer."""
    pm = make_plugin_manager(DeclaredBackend(TorchNativeBackend, {}), builtins="algorithms")
    config = engine_config("torch_native", use_graphs=False, model=TINY_MODEL)
    with Engine(config, device="sim", pm=pm) as engine:
        plain = engine.run(trace_for(3)).outputs
    with Engine(config, device="sim", pm=pm) as engine:
        engine.target.set_probe(ReadTracer(engine.pool.shared_buffers()))
        traced = engine.run(trace_for(3)).outputs
    assert traced == plain
