"""Poison for the scheduler-shared buffers: snapshot, poison and restore, as device work.

The poison must make every late read *visibly wrong* without crashing the forward: an
out-of-range slot index would raise (sticky device error) instead of changing an output. So each
integer entry ``v`` becomes ``(v + shift) % modulus``: a permutation of the valid index range
that moves every value, so a read of any entry, even one element of one row, returns a valid
but different slot. All three operations are static-shape copies between fixed buffers, so the
poison can be captured into a graph (the sanitizer graph) and replayed at the in-graph node.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["SharedBufferPoison"]


class SharedBufferPoison:
    """Backup and poisoned copies of ``buffers``, made at :meth:`snapshot` time.

    ``modulus``: the number of valid values of the integer buffers (the KV pool's slot count
    for ``req_to_token`` and ``full_to_swa_index_mapping``). Floating-point buffers get
    ``v + 1``, which changes every value.
    """

    def __init__(self, buffers: Mapping[str, torch.Tensor], modulus: int) -> None:
        if modulus < 2:
            raise ValueError(f"poison needs at least two valid values, got modulus {modulus}")
        # Buffers are matched by storage, so two names for one tensor are poisoned once.
        unique: dict[int, tuple[str, torch.Tensor]] = {}
        for name, tensor in buffers.items():
            unique.setdefault(tensor.untyped_storage().data_ptr(), (name, tensor))
        self.buffers = {name: tensor for name, tensor in unique.values()}
        self.modulus = modulus
        # About half the range away (far from the original slot) and odd, so the change also
        # survives a reduction modulo any power of two (a slot taken % vocab, % page size).
        self.shift = (modulus // 2) | 1
        self._backup = {n: torch.empty_like(t) for n, t in self.buffers.items()}
        self._poisoned = {n: torch.empty_like(t) for n, t in self.buffers.items()}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.buffers)

    def snapshot(self) -> None:
        """Device work: remember the buffers and prepare their poisoned values."""
        for name, buf in self.buffers.items():
            self._backup[name].copy_(buf)
            poisoned = self._poisoned[name]
            poisoned.copy_(buf)
            if buf.is_floating_point():
                poisoned.add_(1)
            else:
                poisoned.add_(self.shift).remainder_(self.modulus)

    def poison(self) -> None:
        """Device work (graph-safe): overwrite the buffers with their poisoned values.
        Idempotent, so two record points in one step poison the same way."""
        for name, buf in self.buffers.items():
            buf.copy_(self._poisoned[name])

    def restore(self) -> None:
        """Device work: put the snapshot back."""
        for name, buf in self.buffers.items():
            buf.copy_(self._backup[name])
