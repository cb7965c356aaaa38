"""``acme``: paged attention that snapshots the page table before every replay.

Everything it reads from the scheduler-shared buffers (``req_to_token`` and the SWA mapping)
is copied into private static buffers in ``init_forward_metadata_out_graph``, which runs
eagerly before a graph replay. The in-graph init only builds masks from positions, and the
layers read only the private copies: the ``PRE_REPLAY`` declaration in every mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore.attention.torch_native import TorchNativeBackend

if TYPE_CHECKING:
    from warcore.runners.batch import ForwardBatch

__all__ = ["AcmeBackend"]


class AcmeBackend(TorchNativeBackend):
    name = "acme"

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        # Static shapes on static buffers: the private copies are fixed addresses that the
        # captured graph reads on every replay.
        self.gather_page_table(batch)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self.build_masks(batch)  # positions only: nothing the scheduler writes
