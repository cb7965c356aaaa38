"""The body of a ``multiprocessing`` ``spawn`` child (test_spawn.py): what sglang's scheduler
process does first, ``load_plugins()``, then whether sglang's declaration points answer
through warcore there. Results go to a JSON file (the parent reads it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

WATCHED = (
    "sglang.srt.layers.attention.base_attn_backend",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.layers.attention.trtllm_mha_backend",
)


def child(out: str) -> None:
    result: dict[str, Any] = {"pid": os.getpid(), "env": os.environ.get("WARCORE_SGLANG")}
    from sglang.srt.plugins import load_plugins

    load_plugins()  # sglang's own loader: runs the entry points of group sglang.srt.plugins
    import warcore_sglang

    result["installed"] = warcore_sglang.is_installed()
    result["imported_before"] = [m for m in WATCHED if m in sys.modules]
    if result["installed"]:
        from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
        from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
            DecodeCudaGraphRunner,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        import warcore

        patched = vars(DecodeCudaGraphRunner)["_resolve_shared_read_ends"]
        result["runner_patched"] = hasattr(patched, "__warcore_original__")
        result["backend_patched"] = hasattr(
            vars(TRTLLMHAAttnBackend)["shared_read_ends"], "__warcore_original__"
        )
        runner: Any = object.__new__(DecodeCudaGraphRunner)
        runner.in_graph_metadata_prep_done = object()
        runner.model_runner = SimpleNamespace(shared_read_done_event=None)
        trt: Any = object.__new__(TRTLLMHAAttnBackend)
        trt.model_runner = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.NONE)
        result["before"] = runner._resolve_shared_read_ends(trt, ForwardMode.DECODE).name

        class Later:
            @warcore.hookimpl
            def warcore_shared_read_boundary(
                self, backend: str, forward_mode: Any, context: Any
            ) -> Any:
                if backend == "sglang_trtllm_mha" and forward_mode is warcore.ForwardMode.DECODE:
                    return warcore.SharedReadBoundary.POST_REPLAY
                return None

        warcore.get_plugin_manager().register(Later(), name="later")
        result["after"] = runner._resolve_shared_read_ends(trt, ForwardMode.DECODE).name
        result["gate_eagle"] = SpeculativeAlgorithm.EAGLE.supports_prefill_shared_read_done()
        result["ends_type_ok"] = isinstance(
            runner._resolve_shared_read_ends(trt, ForwardMode.DECODE), SharedReadEnds
        )
    Path(out).write_text(json.dumps(result))
