"""The backend class (imported when sglang's registry builds it)."""

from __future__ import annotations

from typing import Any

from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode


class ForkNativeAttnBackend(TorchNativeAttnBackend):
    """torch_native, declaring prefill ``PRE_REPLAY`` (wrong: its forward reads
    ``req_to_token``); every other mode inherits sglang's base declaration."""

    def shared_read_ends(self, fm: Any) -> Any:
        if fm == ForwardMode.EXTEND:
            return SharedReadEnds.PRE_REPLAY
        return super().shared_read_ends(fm)
