"""``trtllm_mha``: paged attention whose prefill snapshots the page table before the replay.

For ``EXTEND`` its out-graph init copies the batch's rows of ``req_to_token`` (and their SWA
translation) into private buffers, so nothing shared is read once the replay starts: the
``PRE_REPLAY`` declaration. Decode follows the metadata contract (in-graph gather).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore.attention.torch_native import TorchNativeBackend
from warcore.core import ForwardMode

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch

__all__ = ["TrtllmMhaBackend"]


class TrtllmMhaBackend(TorchNativeBackend):
    name = "trtllm_mha"

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        if batch.forward_mode is ForwardMode.EXTEND:
            self.gather_page_table(batch)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        if batch.forward_mode is not ForwardMode.EXTEND:
            self.gather_page_table(batch)
        self.build_masks(batch)
