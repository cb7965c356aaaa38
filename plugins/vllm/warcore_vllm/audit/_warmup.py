"""vLLM's warmup functions, run as shipped on the V2 runner, one verdict each.

Each function of :attr:`warcore_vllm.releases.VllmRelease.warmup` (``vllm.v1.worker.gpu.warmup``)
is called with the runner the audit builds and the two callables a worker passes it
(``Worker.execute_model``, ``Worker.sample_tokens``): a step's ``execute_model`` is the
runner's own, its forward launched where input preparation starts (:mod:`warcore_vllm.audit._mrv2`),
and ``sample_tokens`` returns the step's real ``AsyncOutput``, which warmup discards, as it
does on a GPU. Warmup's only waits are its own ``torch.accelerator.synchronize()`` calls (the
recording device's synchronize): whatever a function does between them is what its steps get.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._mrv2 import V2, Shape, current_config, execute, release
from ._v2checks import RingRun, run
from ._verdict import SOUND, VIOLATION, Verdict

__all__ = ["WARMUP_ARGS", "warmup"]

MODULE = "vllm.v1.worker.gpu.warmup"

WARMUP_ARGS: dict[str, dict[str, Any]] = {
    "run_mixed_prefill_decode_warmup": {"num_tokens": 24},
    "run_context_prefill_warmup": {"num_context_tokens": 48},
    "_warmup_kernels": {},
}
"""The token counts each function is given (its real callers pass the token budget; small
here, the shape of its steps the same)."""

CALLS = 2
"""Each function runs twice, back to back, as vLLM's callers chain warmups with nothing between
them (``run_kv_cache_sizing_warmup`` runs the mixed warmup up to twice, then the context
warmup; ``warmup_kernels`` runs ``_warmup_kernels`` twice under speculative decoding): a
function is sound when its steps are, and when what runs next cannot reach them."""


def _drive(name: str) -> Any:
    def plan(v2: V2) -> None:
        launched: list[bool] = []

        def worker_execute_model(scheduler_output: Any) -> None:
            launched.append(execute(v2, scheduler_output, name))

        def worker_sample_tokens(grammar_output: Any) -> Any:
            return release(v2) if launched and launched[-1] else None

        function = getattr(importlib.import_module(MODULE), name)
        with current_config(v2):
            for _ in range(CALLS):
                function(v2.runner, worker_execute_model, worker_sample_tokens, **WARMUP_ARGS[name])
        v2.device.synchronize("after warmup")

    return plan


def warmup(name: str, ring: RingRun | None = None) -> Verdict:
    ring = ring if ring is not None else run(Shape(f"warmup {name}"), _drive(name))
    uses = ring.ledger.uses
    syncs = ring.device.syncs
    first = ring.device.violations[0].describe() if ring.device.violations else ""
    calls = "called once" if CALLS == 1 else f"called {CALLS} times back to back"
    detail = (
        f"{calls}: {ring.steps} synthetic steps, {len(uses)} slot uses "
        f"({len({u.pool for u in uses})} pools), {syncs} device synchronizes inside, outputs "
        f"discarded; depth {ring.depth}"
    )
    cls = f"{MODULE}.{name}"
    if ring.device.violations:
        detail += f"; {len(ring.device.violations)} slot reads rewritten in flight, first: {first}"
        return Verdict("warmup", cls, "warmup", VIOLATION, detail, key=name)
    detail += "; no slot rewritten while a read of it was in flight"
    return Verdict("warmup", cls, "warmup", SOUND, detail, key=name)
