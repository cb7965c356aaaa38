"""``fork_native``: sglang 0.5.23's ``torch_native`` attention backend as a fork would ship it,
with one "optimisation" claimed and not made.

Its ``shared_read_ends`` declares prefill (``EXTEND``) ``PRE_REPLAY``: "the forward's reads of
the scheduler-shared ``req_to_token`` end in ``init_forward_metadata``", as a backend that
snapshots the page table there could say (sglang's ``trtllm_mha`` does). But the forward is
``torch_native``'s, which gathers ``req_to_token[req_pool_idx, :seq_len]`` in every layer
(``layers/attention/torch_native_backend.py``, ``_run_sdpa_forward_extend``). Under sglang's
overlap scheduler on a GPU that lets the scheduler rewrite a row while the prefill still reads
it (the shape of sglang issue #37936's fork backend). On a CPU the forward runs synchronously,
so its tokens stay right: only the sanitizer shows the late read.

Registered the way sglang lets plugins register backends: the ``sglang.srt.plugins`` entry
point ``fork_attn`` (run by ``load_plugins()`` in every server process) adds the name to the
CLI's choices and the factory to the attention registry.
"""

from __future__ import annotations

from typing import Any

NAME = "fork_native"


def register() -> None:
    from sglang.srt.arg_groups.choices import add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )

    if NAME in ATTENTION_BACKENDS:
        return
    add_attention_backend_choices([NAME])

    @register_attention_backend(NAME)
    def create_fork_native_backend(runner: Any) -> Any:
        from .backend import ForkNativeAttnBackend

        return ForkNativeAttnBackend(runner)
