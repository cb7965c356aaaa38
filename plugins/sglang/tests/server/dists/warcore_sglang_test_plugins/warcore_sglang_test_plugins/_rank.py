"""This process's rank in sglang's world group (``None`` before it is set up)."""

from __future__ import annotations


def rank() -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else None
    except Exception:
        return None
