"""Forward modes: what kind of forward pass a runner is executing."""

from __future__ import annotations

import enum

__all__ = ["CAPTURED_MODES", "CONTRACT_MODES", "ForwardMode"]


class ForwardMode(enum.Enum):
    """The kind of forward pass, with sglang 0.5.23's member names.

    ``TARGET_VERIFY`` is the target model checking a block of draft tokens; ``DRAFT_EXTEND_V2``
    is the draft model catching up on the tokens the target accepted (EAGLE runs it after verify).
    ``PREBUILT`` is disaggregated decode's first forward (the KV arrived from a prefill node),
    ``SPLIT_PREFILL`` a prefill split across PD-multiplexing streams, ``DLLM_EXTEND`` a diffusion
    LM's block extend. ``DRAFT_EXTEND`` is not in sglang 0.5.23 (it was in #34052): warcore keeps
    it for the reference engine's EAGLE draft prefill over the prompt.
    """

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    DRAFT_EXTEND_V2 = "draft_extend_v2"
    PREBUILT = "prebuilt"
    SPLIT_PREFILL = "split_prefill"
    DLLM_EXTEND = "dllm_extend"

    # Identity hash (members are singletons): Enum's own __hash__ is a Python-level call, and
    # members key the per-replay decision lookup, where it cost ~0.1 µs per member.
    __hash__ = object.__hash__

    def is_extend(self) -> bool:
        """Forwards that append several tokens per request (prefill-shaped)."""
        return self in _EXTEND_LIKE

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_mixed(self) -> bool:
        return self is ForwardMode.MIXED

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self in (ForwardMode.DRAFT_EXTEND, ForwardMode.DRAFT_EXTEND_V2)

    def is_draft_extend_v2(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND_V2

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_prebuilt(self) -> bool:
        return self is ForwardMode.PREBUILT

    def is_split_prefill(self) -> bool:
        return self is ForwardMode.SPLIT_PREFILL

    def is_dllm_extend(self) -> bool:
        return self is ForwardMode.DLLM_EXTEND

    def is_captured_kind(self) -> bool:
        """Modes a runner may replay from a captured graph (decode, verify, draft-extend):
        their declarations describe the graph, and an eager run needs its own declaration."""
        return self in CAPTURED_MODES

    @classmethod
    def parse(cls, value: str | ForwardMode) -> ForwardMode:
        """Accept a member, its name (``"TARGET_VERIFY"``) or its value (``"target_verify"``)."""
        if isinstance(value, ForwardMode):
            return value
        key = str(value).strip()
        for mode in cls:
            if key in (mode.name, mode.value):
                return mode
        valid = ", ".join(m.name for m in cls)
        raise ValueError(f"unknown forward mode {value!r}; valid: {valid}")


_EXTEND_LIKE = frozenset(
    {
        ForwardMode.EXTEND,
        ForwardMode.MIXED,
        ForwardMode.TARGET_VERIFY,
        ForwardMode.DRAFT_EXTEND,
        ForwardMode.DRAFT_EXTEND_V2,
        ForwardMode.SPLIT_PREFILL,
        ForwardMode.DLLM_EXTEND,
    }
)

CAPTURED_MODES = frozenset(
    {ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2}
)
"""Modes whose declarations describe a captured graph (sglang audits them for the graph)."""

CONTRACT_MODES = frozenset({ForwardMode.DECODE, ForwardMode.TARGET_VERIFY})
"""The modes the attention-backend metadata contract covers: a backend that follows it reads
scheduler-shared buffers only up to its in-graph init in a captured decode and verify, so they
may record ``IN_REPLAY``. A backend says so in one line of its spec,
``BackendSpec(..., follows_contract=CONTRACT_MODES)`` (or the modes it follows it in); nothing
is assumed."""
