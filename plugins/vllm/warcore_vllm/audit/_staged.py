"""``StagedWriteTensor.stage_write``'s by-reference inputs: 0.34.0 keeps a numpy array or an
``array.array`` by reference until ``apply_write`` copies it into a pool slot
(``gpu/buffer_utils.py:218-246``), so a host write to it in between changes what is uploaded.

* :func:`by_reference`: whether the installed ``stage_write`` keeps an array by reference (run
  on vLLM's class: an array staged, then changed, then applied);
* :func:`call_sites`: every ``.stage_write(`` call in the installed vLLM package, read from its
  source files;
* :class:`Trace`: in a run of vLLM's runner, every array staged is copied at ``stage_write``
  and compared, when its tensor's writes are applied (``apply_write``, or the fused writer's
  ``apply``), with what it holds then: a difference is a host write between the two.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CallSite", "Trace", "by_reference", "call_sites"]


@dataclass(frozen=True)
class CallSite:
    path: str
    line: int
    argument: str


def call_sites() -> list[CallSite]:
    """Every ``<x>.stage_write(index, start, x)`` in the installed ``vllm`` package."""
    import vllm

    root = Path(vllm.__file__).parent
    found: list[CallSite] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if ".stage_write(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "stage_write"
            ):
                args = [*node.args, *(k.value for k in node.keywords if k.arg == "x")]
                staged = ast.unparse(args[2]) if len(args) > 2 else "?"
                found.append(CallSite(str(path.relative_to(root.parent)), node.lineno, staged))
    return found


def by_reference() -> bool:
    """Stage ``np.array([10, 11, 12])`` on a real ``StagedWriteTensor``, set it to 99, apply:
    True when the row holds 99 (kept by reference), False when it holds what was staged.
    Call inside ``_ring.cpu_uva()`` and a ledger's ``installed()`` (the kernel stand-in)."""
    from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

    tensor = StagedWriteTensor((2, 4), torch.int32, torch.device("cpu"))
    staged = np.array([10, 11, 12], dtype=np.int32)
    tensor.stage_write(1, 0, staged)
    staged[:] = 99
    tensor.apply_write()
    return bool((tensor.gpu[1, :3] == 99).all())


@dataclass
class Trace:
    """Arrays staged and not yet applied, per tensor; what changed in between."""

    pending: dict[int, list[tuple[str, Any, np.ndarray]]] = field(default_factory=dict)
    staged: dict[str, Counter[str]] = field(default_factory=dict)
    """Caller (file:line) -> the types it staged, counted."""
    changed: list[str] = field(default_factory=list)

    def _stage(self, tensor: Any, x: Any) -> None:
        from vllm.v1.worker.gpu import buffer_utils

        caller = sys._getframe(2)
        where = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
        self.staged.setdefault(where, Counter())[type(x).__name__] += 1
        if isinstance(x, buffer_utils._BUFFER_TYPES) and len(x):
            self.pending.setdefault(id(tensor), []).append((where, x, np.array(x, copy=True)))

    def arrays(self) -> dict[str, int]:
        """Caller -> arrays (numpy, ``array.array``) it staged."""
        kinds = ("ndarray", "array")
        return {
            w: sum(c[k] for k in kinds) for w, c in self.staged.items() if any(c[k] for k in kinds)
        }

    def _applied(self, tensor: Any) -> None:
        for where, live, copy in self.pending.pop(id(tensor), []):
            if not np.array_equal(np.asarray(live), copy):
                self.changed.append(
                    f"the array {where} staged was written before apply_write (staged "
                    f"{copy.tolist()[:4]}, applied {np.asarray(live).tolist()[:4]})"
                )

    @contextlib.contextmanager
    def installed(self) -> Iterator[Trace]:
        """``stage_write``, ``apply_write`` and ``FusedStagedWriter.apply`` recorded (vLLM's
        own run, then the trace looks) for the block."""
        from vllm.v1.worker.gpu.buffer_utils import FusedStagedWriter, StagedWriteTensor

        trace = self
        stage, apply = (
            vars(StagedWriteTensor)["stage_write"],
            vars(StagedWriteTensor)["apply_write"],
        )
        fused = vars(FusedStagedWriter)["apply"]

        def stage_write(tensor: Any, index: int, start: int, x: Any) -> None:
            trace._stage(tensor, x)
            stage(tensor, index, start, x)

        def apply_write(tensor: Any) -> None:
            trace._applied(tensor)
            apply(tensor)

        def fused_apply(writer: Any, tensors: Any, *args: Any) -> None:
            for tensor in tensors:
                trace._applied(tensor)
            fused(writer, tensors, *args)

        StagedWriteTensor.stage_write = stage_write
        StagedWriteTensor.apply_write = apply_write
        FusedStagedWriter.apply = fused_apply
        try:
            yield self
        finally:
            StagedWriteTensor.stage_write = stage
            StagedWriteTensor.apply_write = apply
            FusedStagedWriter.apply = fused
