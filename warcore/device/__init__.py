"""One device layer, two implementations: ``sim`` (CPU worker threads) and ``cuda``.

Runner and engine code is written against :class:`Device`, :class:`Stream`, :class:`Event` and
:class:`Graph` only and runs unchanged on both. Importing this package does no device work and
does not import torch; :func:`get_device` does.
"""

from __future__ import annotations

from ._base import (
    DEVICE_NAMES,
    Device,
    DeviceError,
    Event,
    ForwardId,
    Graph,
    RecordRef,
    SpanSink,
    Stream,
    WaitBinding,
)
from ._ring import EventRing, RingTooShallow, check_ring_depth, records_in_flight

__all__ = [
    "DEVICE_NAMES",
    "Device",
    "DeviceError",
    "Event",
    "EventRing",
    "ForwardId",
    "Graph",
    "RecordRef",
    "RingTooShallow",
    "SpanSink",
    "Stream",
    "WaitBinding",
    "check_ring_depth",
    "get_device",
    "records_in_flight",
]


def get_device(name: str | None = None) -> Device:
    """A new device: ``"sim"``, ``"cuda"``, or ``None`` for cuda when a GPU is usable, else sim.

    Raises :class:`ValueError` for an unknown name and :class:`DeviceError` for ``"cuda"`` on a
    machine without a usable GPU.
    """
    if name is None:
        import torch

        name = "cuda" if torch.cuda.is_available() else "sim"
    if name == "sim":
        from ._sim import SimDevice

        return SimDevice()
    if name == "cuda":
        from ._cuda import CudaDevice

        return CudaDevice()
    raise ValueError(f"unknown device {name!r}; valid: {', '.join(DEVICE_NAMES)}")
