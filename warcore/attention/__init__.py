"""Attention backends and their metadata contract."""

from ._base import AttentionBackend
from ._reads import declare_shared_read

__all__ = ["AttentionBackend", "declare_shared_read"]
