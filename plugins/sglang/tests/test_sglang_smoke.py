"""Smoke test: the installed sglang release's real classes import here and answer as its
source says.

Skips where sglang is not installed (the core suite's environments); runs in each sglang nox
session, which installs plugins/sglang/sglang-<release>-pins.txt.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

sglang = pytest.importorskip("sglang")


def test_pinned_release() -> None:
    from pathlib import Path

    listed = (Path(__file__).parents[1] / "sglang-releases.txt").read_text().split()
    assert sglang.__version__ in listed  # an audited release, exactly


def test_real_declarations_on_bare_objects() -> None:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, SharedReadEnds
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ends = SharedReadEnds
    base = object.__new__(AttentionBackend)
    trt = object.__new__(TRTLLMHAAttnBackend)
    dsv4 = object.__new__(DeepseekV4AttnBackend)
    dsv4.model_runner = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE)

    assert [e.value for e in ends] == [1, 2, 3, 4]
    assert base.shared_read_ends(ForwardMode.EXTEND) is ends.UNKNOWN
    assert base.shared_read_ends(ForwardMode.DECODE) is ends.IN_REPLAY
    assert trt.shared_read_ends(ForwardMode.EXTEND) is ends.PRE_REPLAY
    assert trt.shared_read_ends(ForwardMode.DRAFT_EXTEND_V2) is ends.UNKNOWN
    assert dsv4.shared_read_ends(ForwardMode.TARGET_VERIFY) is ends.POST_REPLAY
    dsv4.model_runner = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.DSPARK)
    assert dsv4.shared_read_ends(ForwardMode.TARGET_VERIFY) is ends.IN_REPLAY


def test_decode_runner_resolution_on_a_bare_runner() -> None:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    backend = object.__new__(AttentionBackend)
    runner = object.__new__(DecodeCudaGraphRunner)
    runner.in_graph_metadata_prep_done = object()
    assert runner._resolve_shared_read_ends(backend, ForwardMode.DECODE) is (
        SharedReadEnds.IN_REPLAY
    )
    runner.in_graph_metadata_prep_done = None
    # no in-graph marker: 0.5.22 and 0.5.23 record after the replay; 0.5.21 before it
    # ("this lands EARLIER than declared", its own comment)
    unmarked = "PRE_REPLAY" if sglang.__version__ == "0.5.21" else "POST_REPLAY"
    assert (
        runner._resolve_shared_read_ends(backend, ForwardMode.DECODE) is (SharedReadEnds[unmarked])
    )
