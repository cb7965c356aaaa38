"""vLLM's V2 staging ring on a CPU: every use of a ``UvaBufferPool`` slot, counted per step
through every entry point the pool has, and each slot's device reads held pending until the
step's release point.

* **The entry points** (:func:`entry_points`) are read from ``UvaBufferPool``'s own source:
  the public methods that advance its round robin themselves or through a private helper
  (0.33.0: ``copy_to_uva``; 0.34.0: ``copy_to_uva`` and ``copy_chunks_to_uva``, both through
  ``_next_buf``). A method that reaches the ring only through another public one
  (``copy_to_gpu`` -> ``copy_to_uva``) is not counted twice.
* **The ledger** (:class:`RingLedger`) wraps each entry point for the duration of a ``with``
  block (vLLM's method runs, then the use is recorded: which pool, which slot, in which step,
  owned by which ring user). A slot the host writes while a device read of it, enqueued
  earlier, is not yet known to be done is a write-after-read: a
  :class:`~warcore_vllm.audit._device.Violation`, whatever bytes it writes.
* **Device reads.** ``_apply_write_kernel`` reads its four (or five) slots when it is launched;
  a step's forward reads every slot the step staged (the views its kernels get: a
  ``UvaBackedTensor``'s ``.gpu``, the block tables' ``num_blocks``). Both are pending until the
  device is known to be past them (:class:`~warcore_vllm.audit._device.RecordingDevice`: an event
  recorded after them synchronized, or a device synchronize).

Stand-ins, each only for what a CPU cannot run: vLLM's own CPU ``UvaBuffer``
(``vllm/v1/worker/cpu/buffer_utils.py``, what vLLM's CPU runner puts in the pool; the stock one
needs pinned memory, which needs an accelerator) and the Triton kernels a step's staging
launches, in torch (:data:`KERNELS`: ``_apply_write_kernel``, the penalties' ``_bincount_kernel``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from warcore.integration import engine_code

from ._device import RecordingDevice, Violation

__all__ = ["ApplyWriteKernel", "RingLedger", "Use", "cpu_uva", "entry_points", "owners"]

BUFFERS = "vllm.v1.worker.gpu.buffer_utils"


def _advances(node: ast.FunctionDef) -> bool:
    return any(
        isinstance(sub, ast.Assign | ast.AugAssign)
        and "self._curr"
        in ast.unparse(sub.targets[0] if isinstance(sub, ast.Assign) else sub.target)
        for sub in ast.walk(node)
    )


def _self_calls(node: ast.FunctionDef) -> set[str]:
    return {
        sub.func.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and ast.unparse(sub.func.value) == "self"
    }


def entry_points(cls: type) -> tuple[str, ...]:
    """The public methods of ``cls`` (vLLM's ``UvaBufferPool``) that advance its round robin
    (assign ``self._curr``) themselves or through a private method that does, read from the
    class's source, in the order the class defines them."""
    methods = {
        name: engine_code.definition(value)
        for name, value in vars(cls).items()
        if callable(value) and getattr(value, "__code__", None) is not None
    }
    nodes = {n: m for n, m in methods.items() if isinstance(m, ast.FunctionDef)}
    advancing = {name for name, node in nodes.items() if _advances(node)}
    changed = True
    while changed:  # a private helper of a private helper that advances, and so on
        grown = {
            name
            for name, node in nodes.items()
            if name not in advancing
            and any(c in advancing and c.startswith("_") for c in _self_calls(node))
        }
        advancing |= grown
        changed = bool(grown)
    return tuple(n for n in nodes if n in advancing and not n.startswith("_"))


@contextlib.contextmanager
def cpu_uva(*, uva: bool = True) -> Iterator[Any]:
    """vLLM's V2 buffer module with vLLM's CPU ``UvaBuffer`` as its UVA buffer (what vLLM's
    CPU runner swaps in where Triton exists; the stock one needs pinned memory, which needs an
    accelerator), and its default depth and the swap put back after the block. ``uva=False``:
    every pool slot is vLLM's real ``NonUvaBuffer`` (a host buffer copied to a device tensor
    at each use), as under Confidential Computing, where ``is_uva_available()`` is False."""
    import vllm.v1.worker.cpu.buffer_utils as cpu_buffers
    import vllm.v1.worker.gpu.buffer_utils as buffers

    saved = buffers.UvaBuffer, buffers.is_uva_available, buffers._DEFAULT_MAX_CONCURRENCY
    buffers.UvaBuffer = cpu_buffers.UvaBuffer
    buffers.is_uva_available = lambda: uva
    try:
        yield buffers
    finally:
        buffers.UvaBuffer, buffers.is_uva_available, buffers._DEFAULT_MAX_CONCURRENCY = saved


class _Kernel:
    """A Triton kernel in torch: ``kernel[grid](...)`` runs :meth:`_launch` on the ledger."""

    _launch: Callable[..., None]

    def __init__(self, ledger: RingLedger) -> None:
        self.ledger = ledger

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self._launch


class ApplyWriteKernel(_Kernel):
    """``_apply_write_kernel`` (``vllm/v1/worker/gpu/buffer_utils.py``, Triton) in torch: for
    each write ``pid``, ``contents[cu_lens[pid-1]:cu_lens[pid]]`` into row ``indices[pid]``
    from column ``starts[pid]`` of the output (per write group through ``output_ptr`` /
    ``output_stride`` when ``MULTI_GROUP``). Its slot inputs are device reads, launched now
    (:meth:`RingLedger.kernel_reads`)."""

    def _launch(
        self,
        output: Any,
        stride: Any,
        indices: torch.Tensor,
        starts: torch.Tensor,
        contents: torch.Tensor,
        cu_lens: torch.Tensor,
        group_ids: torch.Tensor | None,
        BLOCK_SIZE: int,
        MULTI_GROUP: bool,
    ) -> None:  # noqa: N803 - the kernel's names
        self.ledger.kernel_reads(
            "_apply_write_kernel", indices, starts, contents, cu_lens, group_ids
        )
        ends = cu_lens.tolist()
        for pid, (row, start) in enumerate(zip(indices.tolist(), starts.tolist(), strict=True)):
            lo, hi = (ends[pid - 1] if pid else 0), ends[pid]
            target, row_stride = output, stride
            if MULTI_GROUP:
                assert group_ids is not None
                group = int(group_ids[pid])
                target = self.ledger.target(int(output[group]))
                row_stride = int(stride[group])
            flat = target.view(-1)
            at = row * row_stride + start
            flat[at : at + hi - lo] = contents[lo:hi].to(flat.dtype)


class BincountKernel(_Kernel):
    """``_bincount_kernel`` (``vllm/v1/worker/gpu/sample/penalties.py``, Triton) in torch: for
    each request of ``expanded_idx_mapping``, the bit of each prompt token (``[0, prompt_len)``
    of its ``all_token_ids`` row) set in ``prompt_bin_mask`` and each output token
    (``[prompt_len, prefill_len)``) counted in ``output_bin_counts``. It reads the
    ``prompt_len`` / ``prefill_len`` slots in place when launched."""

    def _launch(
        self,
        idx_mapping: torch.Tensor,
        all_token_ids: torch.Tensor,
        stride: int,
        prompt_len: torch.Tensor,
        prefill_len: torch.Tensor,
        prompt_bin_mask: torch.Tensor,
        mask_stride: int,
        output_bin_counts: torch.Tensor,
        counts_stride: int,
        BLOCK_SIZE: int,
    ) -> None:  # noqa: N803 - the kernel's names
        self.ledger.kernel_reads("_bincount_kernel", prompt_len, prefill_len)
        for req in idx_mapping.tolist():
            prompt, prefill = int(prompt_len[req]), int(prefill_len[req])
            for token in all_token_ids[req, :prompt].tolist():
                prompt_bin_mask[req, token // 32] |= 1 << (token % 32)
            for token in all_token_ids[req, prompt:prefill].tolist():
                output_bin_counts[req, token] += 1


KERNELS: tuple[tuple[str, str, type], ...] = (
    (BUFFERS, "_apply_write_kernel", ApplyWriteKernel),
    ("vllm.v1.worker.gpu.sample.penalties", "_bincount_kernel", BincountKernel),
)
"""The Triton kernels a step's staging launches, each with its torch stand-in."""


@dataclass(frozen=True)
class Use:
    """One use of a pool slot: the host wrote it, through ``entry``."""

    step: int
    kind: str
    owner: str
    pool: str
    entry: str
    slot: int
    depth: int


def owners(
    root: Any, pool_cls: type, users: frozenset[str], name: str = "runner"
) -> dict[int, tuple[str, str]]:
    """Every ``pool_cls`` reachable from ``root`` through vLLM objects' attributes, lists,
    tuples and dicts: ``id(pool)`` -> (its ring user: the innermost object on its path whose
    class is named in ``users``, else its top-level attribute's class; the attribute path)."""
    found: dict[int, tuple[str, str]] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, user: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, pool_cls):
            found[id(obj)] = (user, path)
            return
        if isinstance(obj, list | tuple):
            for i, item in enumerate(obj):
                walk(item, f"{path}[{i}]", user)
            return
        if isinstance(obj, dict):
            for key, item in obj.items():
                walk(item, f"{path}[{key!r}]", user)
            return
        if not type(obj).__module__.startswith("vllm") or not hasattr(obj, "__dict__"):
            return
        here = type(obj).__name__
        user = here if here in users or path.count(".") == 1 else user
        for attr, value in vars(obj).items():
            walk(value, f"{path}.{attr}", user)

    for attr, value in vars(root).items():
        walk(value, f"{name}.{attr}", type(value).__name__)
    return found


@dataclass
class RingLedger:
    """The uses of every pool slot and the device reads of them (see the module docstring)."""

    device: RecordingDevice
    entries: tuple[str, ...]
    step: int = 0
    kind: str = ""
    uses: list[Use] = field(default_factory=list)
    names: dict[int, tuple[str, str]] = field(default_factory=dict)
    targets: dict[int, torch.Tensor] = field(default_factory=dict)
    backed: list[tuple[str, Any]] = field(default_factory=list)
    """Every ``UvaBackedTensor`` watched, by its pool's path: the forward reads its ``.gpu``."""
    slots: dict[int, str] = field(default_factory=dict)
    """Storage address of every slot used so far -> its pool's path."""
    _unread: list[tuple[Use, torch.Tensor]] = field(default_factory=list)

    def begin(self, step: int, kind: str) -> None:
        self.step, self.kind, self.device.step = step, kind, step
        self._unread.clear()

    def watch(self, root: Any, users: frozenset[str]) -> None:
        """Name every pool reachable from ``root`` (the runner) by its ring user, and know each
        ``StagedWriteTensor``'s output for the fused writer's pointers."""
        import vllm.v1.worker.gpu.buffer_utils as buffers

        self.names.update(owners(root, buffers.UvaBufferPool, users))
        for staged in _instances(root, buffers.StagedWriteTensor):
            self.targets[staged.gpu.data_ptr()] = staged.gpu
        for backed in _instances(root, buffers.UvaBackedTensor):
            self.backed.append((self.names[id(backed.pool)][1], backed))

    def target(self, pointer: int) -> torch.Tensor:
        return self.targets[pointer]

    def _record(self, pool: Any, entry: str, view: torch.Tensor) -> None:
        if not self.kind:  # a constructor's first upload (UvaBackedTensor), before any step
            return
        user, path = self.names.get(id(pool), ("unnamed pool", f"pool {id(pool):#x}"))
        self.device.rewritten(view, f"{entry} of {path} in step {self.step} ({self.kind})")
        use = Use(self.step, self.kind, user, path, entry, int(pool._curr), pool.max_concurrency)
        self.uses.append(use)
        self.slots[view.untyped_storage().data_ptr()] = path
        self._unread.append((use, view))

    def kernel_reads(self, kernel: str, *views: torch.Tensor | None) -> None:
        """A kernel launched now reads these slot views."""
        for view in views:
            if view is not None:
                self.device.read_in_place(self._name(view), view, f"{kernel} ({self.kind})")
        keys = {v.untyped_storage().data_ptr() for v in views if v is not None}
        self._unread = [
            (u, v) for u, v in self._unread if v.untyped_storage().data_ptr() not in keys
        ]

    def forward(self, what: str) -> None:
        """The step's forward is launched: it reads every slot the step staged that no kernel
        has read yet, and the slot each watched ``UvaBackedTensor``'s ``.gpu`` is on (staged in
        this step or an earlier one; every state's, the upper bound of what a forward reads)."""
        reads = [(use.pool, view) for use, view in self._unread]
        staged = {view.untyped_storage().data_ptr() for _, view in reads}
        reads += [
            (path, backed.gpu)
            for path, backed in self.backed
            if backed.gpu.untyped_storage().data_ptr() not in staged
        ]
        for path, view in reads:
            self.device.read_in_place(path, view, f"{what} ({self.kind})")
        self._unread.clear()

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Every slot an op reads inside the block is a device read launched now (what the
        code inside reads is found, not declared: vLLM's own method runs inside)."""
        with _SlotReads(self, f"{what} ({self.kind})"):
            yield

    def _name(self, view: torch.Tensor) -> str:
        key = view.untyped_storage().data_ptr()
        for use, unread in reversed(self._unread):
            if unread.untyped_storage().data_ptr() == key:
                return use.pool
        return "pool slot"

    def per_step(self, owner: str | None = None) -> Counter[tuple[int, str]]:
        """(step, pool) -> uses, for one ring user or all."""
        return Counter((u.step, u.pool) for u in self.uses if owner in (None, u.owner))

    def violations(self, owner_paths: set[str] | None = None) -> list[Violation]:
        return [v for v in self.device.violations if owner_paths is None or v.buffer in owner_paths]

    @contextlib.contextmanager
    def installed(self) -> Iterator[RingLedger]:
        """The entry points recorded and the staging's Triton kernels (:data:`KERNELS`) stood
        in, for the block."""
        import vllm.v1.worker.gpu.buffer_utils as buffers

        cls = buffers.UvaBufferPool
        saved = {name: vars(cls)[name] for name in self.entries}
        modules = [importlib.import_module(module) for module, _, _ in KERNELS]
        names = [name for _, name, _ in KERNELS]
        kernels = [(m, name, getattr(m, name)) for m, name in zip(modules, names, strict=True)]
        for name, original in saved.items():
            setattr(cls, name, self._wrap(name, original))
        for module, (_, name, standin) in zip(modules, KERNELS, strict=True):
            setattr(module, name, standin(self))
        try:
            yield self
        finally:
            for name, original in saved.items():
                setattr(cls, name, original)
            for module, name, kernel in kernels:
                setattr(module, name, kernel)

    def _wrap(
        self, name: str, original: Callable[..., torch.Tensor]
    ) -> Callable[..., torch.Tensor]:
        ledger = self

        @functools.wraps(original)
        def entry(pool: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            view = original(pool, *args, **kwargs)
            ledger._record(pool, name, view)
            return view

        return entry


class _SlotReads(TorchDispatchMode):  # type: ignore[no-untyped-call]
    def __init__(self, ledger: RingLedger, what: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ledger, self.what = ledger, what

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        written = args[0] if func._schema.is_mutable and args else None
        for arg in [*args, *(kwargs or {}).values()]:
            if isinstance(arg, torch.Tensor) and arg is not written:
                path = self.ledger.slots.get(arg.untyped_storage().data_ptr())
                if path is not None:
                    self.ledger.device.read_in_place(path, arg, self.what)
        return func(*args, **(kwargs or {}))


def _instances(root: Any, cls: type) -> Iterator[Any]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, cls):
            yield obj
        if isinstance(obj, list | tuple):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("vllm") and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
