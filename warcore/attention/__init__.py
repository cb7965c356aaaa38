"""Attention backends and their metadata contract (imported on first use: the backends need
torch, the core's built-in plugin that offers them does not)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from warcore._lazy import lazy_exports

if TYPE_CHECKING:
    from warcore.attention._base import AttentionBackend
    from warcore.attention._reads import declare_shared_read

__all__ = ["AttentionBackend", "declare_shared_read"]

_EXPORTS = {
    "AttentionBackend": "warcore.attention._base",
    "declare_shared_read": "warcore.attention._reads",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
