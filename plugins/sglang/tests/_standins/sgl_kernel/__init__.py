"""Import-only stand-in for ``sgl_kernel`` (test support for warcore-sglang's real-server tests
on a CPU-only machine).

Under ``SGLANG_USE_CPU_ENGINE=1`` sglang 0.5.23 imports eight names from ``sgl_kernel`` at
module level with no fallback (``kernels/ops/kvcache/cache_move.py``,
``srt/mem_cache/allocation.py`` and the speculative ops); serving a dense model without
speculation calls none of them. Each is defined here and raises if it is ever called. Every
other name stays absent, so that sglang's own ``except ImportError`` fallbacks run, and nothing
is registered under ``torch.ops.sgl_kernel`` (sglang then sees no AMX support and every layer
takes its native torch path). The registry's ``sglang-kernel`` is a CUDA build that does not
load here.

``plugins/sglang/tests/_boot/sitecustomize.py`` serves it only where no real ``sgl_kernel``
is installed and only when ``WARCORE_SGLANG_STANDINS`` names it. Never install it.
"""

from __future__ import annotations

from typing import Any, NoReturn

STANDIN = True

_NAMES = (
    "copy_all_layer_kv_cache_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
)


def _standin(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(
            f"sgl_kernel.{name} was called, but this sgl_kernel is warcore-sglang's import-only "
            "CPU stand-in (plugins/sglang/tests/_standins/sgl_kernel): the served path needs "
            "the real kernel"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in _NAMES:
    globals()[_name] = _standin(_name)
del _name
