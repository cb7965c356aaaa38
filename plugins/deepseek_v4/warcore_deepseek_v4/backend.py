"""``deepseek_v4``: its target-verify re-reads the live page table in every layer.

Its breakable-graph verify selects each layer's tokens through the live ``req_to_token``
(a per-layer top-k selection in the real model), so shared reads last the whole replay: the
``POST_REPLAY`` declaration. With dspark it replays one graph that honours the contract
(``IN_REPLAY``). Other modes follow the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore.attention.torch_native import TorchNativeBackend
from warcore.core import ForwardMode

if TYPE_CHECKING:
    import torch

    from warcore.runners.batch import ForwardBatch

__all__ = ["DeepseekV4Backend"]


class DeepseekV4Backend(TorchNativeBackend):
    name = "deepseek_v4"

    @property
    def verify_reads_every_layer(self) -> bool:
        return self.context.algorithm != "dspark"

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        if batch.forward_mode is ForwardMode.TARGET_VERIFY and self.verify_reads_every_layer:
            self.gather_page_table(batch)
        return super().forward(layer, q, k, v, batch)
