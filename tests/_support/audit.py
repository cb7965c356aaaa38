"""Backends and plugins for the sanitizer, tracer and test-kit tests: each reads a shared buffer
somewhere a declaration may or may not admit."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import torch

import warcore
from warcore import CONTRACT_MODES, AlgorithmSpec, BackendSpec, ForwardMode
from warcore.attention import AttentionBackend, declare_shared_read
from warcore.attention.torch_native import TorchNativeBackend
from warcore.batch import ForwardBatch, RowState
from warcore.engine import ModelConfig

TINY_MODEL = ModelConfig(
    hidden=64,
    layers=2,
    heads=2,
    kv_heads=1,
    head_dim=32,
    ffn=128,
    swa_layers=(1,),
    sliding_window=16,
    max_context=64,
)
"""Half the reference model's layers and width: the same code paths (SWA and full layers,
GQA), half the time per sanitizer run."""

BACKEND_CLASSES = {
    "torch_native": "warcore.attention.torch_native:TorchNativeBackend",
    "trtllm_mha": "warcore_trtllm_mha.backend:TrtllmMhaBackend",
    "deepseek_v4": "warcore_deepseek_v4.backend:DeepseekV4Backend",
}


def backend_class(name: str) -> type[AttentionBackend]:
    """Imported when a test runs, so a checkout without a plugin still collects."""
    module, cls = BACKEND_CLASSES[name].split(":")
    found: type[AttentionBackend] = getattr(importlib.import_module(module), cls)
    return found


class OneElementLateReader(TorchNativeBackend):
    """Reads ONE element of ONE row of ``req_to_token`` (row 1, position 0: the first slot of
    the first admitted request's row) in its last layer, through a view, and lets the value
    nudge the attention output. Its honest boundary is POST_REPLAY."""

    name = "wctest_one_element"

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        out = super().forward(layer, q, k, v, batch)
        if layer == self.pool.cfg.layers - 1:
            slot = self.pool.req_to_token[1, 0]  # a 0-d view: the read is the cast below
            out = out + slot.to(out.dtype) * 1e-3
        return out


class HiddenLateReader(TorchNativeBackend):
    """Reads ``req_to_token`` in its last layer through numpy, which torch's dispatcher never
    sees (like a custom kernel), and declares the read when ``declare`` is set."""

    name = "wctest_hidden_reader"
    declare = True

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        out = super().forward(layer, q, k, v, batch)
        if layer == self.pool.cfg.layers - 1:
            table = self.pool.req_to_token
            if self.declare:
                declare_shared_read(table, "numpy_gather")
            first = int(table.numpy()[1, 0])  # outside the dispatcher
            out = out + first * 1e-3
        return out


class UndeclaredHiddenReader(HiddenLateReader):
    name = "wctest_hidden_undeclared"
    declare = False


class PeekingAlgorithm:
    """A dflash-family algorithm whose drafter reads ``req_to_token`` after the verify (a
    bug the algorithm's publish phase hides: it says the verify is the step's last reader).

    The drafter factory gets no pool, so the backend factory of ``wctest_peek_native`` (plain
    ``torch_native``) hands its pool over: the engine builds the backend before the drafter.
    """

    def __init__(self) -> None:
        self.pool: Any = None

    @warcore.hookimpl
    def warcore_attention_backends(self) -> Iterable[BackendSpec]:
        def make(**kwargs: Any) -> AttentionBackend:
            self.pool = kwargs["pool"]
            return PeekNative(**kwargs)

        return [
            BackendSpec(
                "wctest_peek_native",
                make,
                "torch_native, handing its pool over",
                follows_contract=CONTRACT_MODES,  # torch_native's code
            )
        ]

    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec]:
        def drafter(target: Any, num_draft: int, device: Any) -> PeekingDrafter:
            return PeekingDrafter(self.pool.req_to_token, num_draft, target.cfg.vocab_size)

        return [AlgorithmSpec("wctest_peek", "dflash", "drafts from the page table", drafter)]

    @warcore.hookimpl
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        if algorithm != "wctest_peek":
            return None
        return forward_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)


class PeekNative(TorchNativeBackend):
    name = "wctest_peek_native"


class PeekingDrafter:
    def __init__(self, table: torch.Tensor, num_draft: int, vocab: int) -> None:
        self.table, self.num_draft, self.vocab = table, num_draft, vocab

    def propose(self, rows: torch.Tensor, state: RowState) -> None:
        slots = self.table[rows, : self.num_draft]  # the shared read, after the verify
        state.drafts[rows, : self.num_draft] = slots % self.vocab
