"""Shared reads that torch's dispatcher cannot see, declared where they happen.

The read tracer finds shared reads by watching aten ops. A kernel outside the dispatcher (a
Triton or CUDA kernel handed ``req_to_token`` directly, a library call that reads the tensor's
memory) is invisible to it, so the code that launches such a kernel declares the read with
:func:`declare_shared_read`, from inside the launched work, where the read happens in stream
order. Without a tracer listening the call is a thread-local lookup and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ReadListener", "declare_shared_read", "listening_for_shared_reads"]

ReadListener = Callable[["torch.Tensor", str], None]
"""``listener(tensor, kernel)``: called for each declared read on the listening thread."""

# Thread-local because launched work runs on the stream's thread (a worker thread on sim, the
# host thread on cuda), and the tracer listens on exactly the thread that runs the work.
_local = threading.local()


def declare_shared_read(tensor: torch.Tensor, kernel: str) -> None:
    """Declare that ``kernel``, outside torch's dispatcher, reads ``tensor`` here.

    Call it in the launched work, right where the kernel reads (a view or slice of a shared
    buffer counts as that buffer). The tracer then reports the read with the phase of the work
    it sits in, like the reads it sees itself.
    """
    listener: ReadListener | None = getattr(_local, "listener", None)
    if listener is not None:
        listener(tensor, kernel)


@contextmanager
def listening_for_shared_reads(listener: ReadListener) -> Iterator[None]:
    """Route this thread's :func:`declare_shared_read` calls to ``listener`` in the block."""
    previous: ReadListener | None = getattr(_local, "listener", None)
    _local.listener = listener
    try:
        yield
    finally:
        _local.listener = previous
