"""The drafter's reads of the staging ring: which ring views ``GPUModelRunner.sample_tokens``
hands the speculator, and whether it does so after the step's release (the ``AsyncOutput``
that records ``copy_event``), read from the installed ``sample_tokens``; then, in each step,
vLLM's own ``DraftModelSpeculator._copy_request_inputs`` (the copy every drafter makes of
those views, ``gpu/spec_decode/speculator.py``) run where ``sample_tokens`` runs it.

The speculator is the runner's own, built by its ``__init__`` from the speculative
configuration (EAGLE, :attr:`warcore_vllm.audit._mrv2.Shape.speculative_tokens`); its model is never
loaded (no forward runs here), and nothing else of it touches the ring. A runner without one
gets a namespace holding the three buffers its ``__init__`` allocates for that copy.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from warcore.integration import engine_code

from ._mrv2 import V2

__all__ = ["DrafterOrder", "drafter", "drafter_order"]


@dataclass(frozen=True)
class DrafterOrder:
    views: tuple[str, ...]
    """The ring views passed to ``speculator.propose`` (``sampler.sampling_states.*.gpu``)."""
    after_release: bool
    """``propose`` is called after ``AsyncOutput(...)`` (whose ``copy_event`` is recorded)."""
    release_line: int
    propose_line: int


def _calls(node: ast.AST, suffix: str) -> list[ast.Call]:
    return [
        sub
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith(suffix)
    ]


def drafter_order(runner_cls: type) -> DrafterOrder:
    """Read from ``runner_cls.sample_tokens`` (its own source, or a variant's)."""
    node = engine_code.definition(vars(runner_cls)["sample_tokens"])
    release = min(call.lineno for call in _calls(node, "AsyncOutput"))
    proposals = _calls(node, "speculator.propose")
    views = tuple(
        ast.unparse(arg).removeprefix("self.")
        for call in proposals
        for arg in [*call.args, *(k.value for k in call.keywords)]
        if "sampling_states" in ast.unparse(arg)
    )
    propose = min(call.lineno for call in proposals)
    return DrafterOrder(views, propose > release, release, propose)


def _speculator(v2: V2) -> Any:
    """The runner's own speculator where it built a draft-model one (a speculative
    configuration); else the buffers ``DraftModelSpeculator.__init__`` allocates for the copy
    (the class is abstract, so its method runs on a namespace holding them)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    built = getattr(v2.runner, "speculator", None)
    if isinstance(built, DraftModelSpeculator):
        return built
    n = v2.runner.max_num_reqs
    return SimpleNamespace(
        idx_mapping=torch.zeros(n, dtype=torch.int64),
        temperature=torch.zeros(n, dtype=torch.float32),
        seeds=torch.zeros(n, dtype=torch.int64),
    )


def drafter(order: DrafterOrder) -> Callable[[V2], None]:
    """The drafter's step: its real ``_copy_request_inputs`` of the views ``order`` names,
    each slot it reads found by the ledger (``RingLedger.reading``)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    made: dict[int, Any] = {}

    def run(v2: V2) -> None:
        spec = made.setdefault(id(v2), _speculator(v2))
        named = {view.split(".")[-2]: operator.attrgetter(view)(v2.runner) for view in order.views}
        num_reqs = v2.runner.req_states.num_reqs
        idx = torch.arange(max(num_reqs, 1), dtype=torch.int64)
        with v2.ledger.reading("the drafter's _copy_request_inputs"):
            DraftModelSpeculator._copy_request_inputs(
                spec, num_reqs, idx[:num_reqs], named["temperature"], named["seeds"]
            )

    return run
