"""``deepseek_v4``: its verify and its large prefills re-read the live page table in every layer.

Its breakable-graph verify selects each layer's tokens through the live ``req_to_token`` (a
per-layer top-k selection in the real model), so shared reads last the whole replay: the
``POST_REPLAY`` declaration. With dspark it replays one graph that honours the contract
(``IN_REPLAY``). Decode follows the contract.

Its sparse prefill re-reads the page table in every layer too, unless the out-graph init could
snapshot the batch's rows: a snapshot holds at most :data:`SNAPSHOT_TOKENS` query tokens. A
batch that fits reads only the snapshot once the replay starts (``PRE_REPLAY``); a larger one
reads the live table in every layer, so :meth:`DeepseekV4Backend.refine_prefill_boundary`
withdraws the fast path for it (sglang 0.5.23's ``_snapshot_prefill_shared_reads`` shape).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore.attention.torch_native import TorchNativeBackend
from warcore.core import ForwardMode, SharedReadBoundary

if TYPE_CHECKING:
    import torch

    from warcore.batch import ForwardBatch

__all__ = ["SNAPSHOT_TOKENS", "DeepseekV4Backend"]

SNAPSHOT_TOKENS = 48
"""Query tokens a prefill snapshot holds; larger prefills read the live page table."""


def prefill_fits_snapshot(batch: ForwardBatch) -> bool:
    """Decided from the host's step, so the host-side answer and the device-side behaviour
    of one batch can never disagree."""
    host = batch.host
    return host is not None and sum(host.q_lens) <= SNAPSHOT_TOKENS


class DeepseekV4Backend(TorchNativeBackend):
    name = "deepseek_v4"

    _snapshotted = False
    """Whether the prefill in flight read its rows into the snapshot (set in stream order by
    the out-graph init, read by the in-graph init and the layers that follow it)."""

    @property
    def verify_reads_every_layer(self) -> bool:
        return self.context.algorithm != "dspark"

    def refine_prefill_boundary(self, batch: ForwardBatch) -> SharedReadBoundary:
        if prefill_fits_snapshot(batch):
            return SharedReadBoundary.PRE_REPLAY
        return SharedReadBoundary.UNKNOWN

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        self._snapshotted = batch.forward_mode is ForwardMode.EXTEND and prefill_fits_snapshot(
            batch
        )
        if self._snapshotted:
            self.gather_page_table(batch)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        if batch.forward_mode is ForwardMode.EXTEND:
            self.build_masks(batch)  # the rows were snapshotted, or the layers read them live
            return
        super().init_forward_metadata_in_graph(batch)

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        mode = batch.forward_mode
        if (mode is ForwardMode.TARGET_VERIFY and self.verify_reads_every_layer) or (
            mode is ForwardMode.EXTEND and not self._snapshotted
        ):
            self.gather_page_table(batch)
        return super().forward(layer, q, k, v, batch)
