"""sglang 0.5.23's real classes as the tests ask them: bare objects (``object.__new__``) with
the attributes the methods read, built by hand here, independently of warcore-sglang's own
oracle, so that a test compares warcore's answers with sglang's code, not with itself."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

A = "sglang.srt.layers.attention."


def cls(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def bare(klass: Any, **attrs: Any) -> Any:
    obj = object.__new__(klass)
    obj.__dict__.update(attrs)
    return obj


def algorithm(name: str) -> Any:
    """warcore's algorithm name -> sglang's SpeculativeAlgorithm member."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return (
        SpeculativeAlgorithm.NONE
        if name == "none"
        else SpeculativeAlgorithm[name.removeprefix("sglang_").upper()]
    )


LEAF_CLASSES = {
    "base": A + "base_attn_backend.AttentionBackend",
    "trtllm_mha": A + "trtllm_mha_backend.TRTLLMHAAttnBackend",
    "dsv4": A + "deepseek_v4_backend.DeepseekV4AttnBackend",
    "triton": A + "triton_backend.TritonAttnBackend",
    "flashinfer": A + "flashinfer_backend.FlashInferAttnBackend",
    "mamba2": A + "hybrid_linear_attn_backend.Mamba2AttnBackend",
    "minimax_sparse": A + "minimax_sparse_backend.MiniMaxSparseAttnBackend",
    "minimax_sparse_nvfp4": A + "minimax_sparse_nvfp4_backend.MiniMaxSparseNvfp4AttnBackend",
    "dots_hybrid": A + "dots_hybrid_backend.DotsHybridAttnBackend",
}


def leaf(name: str, algo: Any) -> Any:
    return bare(cls(LEAF_CLASSES[name]), model_runner=SimpleNamespace(spec_algorithm=algo))


def hybrid(prefill: Any, decode: Any, is_decode: bool) -> Any:
    return bare(
        cls(A + "hybrid_attn_backend.HybridAttnBackend"),
        prefill_backend=prefill,
        decode_backend=decode,
        spec_attn_is_decode=is_decode,
    )


def tbo(make: Any) -> Any:
    return bare(cls(A + "tbo_backend.TboAttnBackend"), primary=make(), children=[make(), make()])


def hybrid_linear(full: Any, linear: Any) -> Any:
    return bare(
        cls(A + "hybrid_linear_attn_backend.HybridLinearAttnBackend"),
        attn_backend_list=[full, linear],
    )


def dots_swa_mla(inner: Any) -> Any:
    return bare(cls(A + "dots_hybrid_backend.DotsSWAMLAAttnBackend"), backend=inner)


def minimax_hybrid(dense: Any, algo: Any) -> Any:
    return bare(
        cls(A + "minimax_sparse_backend.MiniMaxHybridAttnBackend"),
        sparse=leaf("minimax_sparse", algo),
        dense=dense,
    )


class _Event:
    def record(self) -> None:
        pass


def prefill(backend: Any, mode: Any = None, *, snapshot: bool = True) -> Any:
    """The installed release's own prefill decision, asked for one batch of ``backend`` (patched
    or not): where sglang has ``AttentionBackend.resolve_prefill_shared_read_ends`` (0.5.23),
    its answer; else (0.5.21, 0.5.22) its publisher ``maybe_publish_prefill_shared_read_done``,
    called through the name its eager runner bound: ``PRE_REPLAY`` where it published an event,
    else ``UNKNOWN``. ``mode``: EXTEND unless given; ``backend.model_runner.spec_algorithm``
    is the algorithm."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND if mode is None else mode)
    if hasattr(AttentionBackend, "resolve_prefill_shared_read_ends"):
        return backend.resolve_prefill_shared_read_ends(
            batch, num_qo_tokens=8, build_snapshot=snapshot
        )
    eager = importlib.import_module("sglang.srt.model_executor.runner.eager_runner")
    runner = SimpleNamespace(
        attn_backend=backend,
        spec_algorithm=backend.model_runner.spec_algorithm,
        shared_read_done_event=None,
        prefill_shared_read_stager=None,
    )
    eager.maybe_publish_prefill_shared_read_done(runner, batch, SimpleNamespace(Event=_Event))
    published = runner.shared_read_done_event is not None
    return SharedReadEnds.PRE_REPLAY if published else SharedReadEnds.UNKNOWN


def warcore_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The ``warcore`` console script of this environment, in a subprocess (stand-ins through
    the PYTHONPATH conftest.py sets)."""
    script = Path(sys.executable).with_name("warcore")
    return subprocess.run(
        [str(script), *args],
        capture_output=True,
        text=True,
        check=check,
        env=dict(os.environ),
        timeout=600,
    )
