"""Attention backends and their metadata contract."""

from ._base import AttentionBackend

__all__ = ["AttentionBackend"]
