"""Every decision cell the activation answers on the installed sglang's real classes, as a table.

One row per (patched point, backend, algorithm, mode, ...): the decode runner's
``_resolve_shared_read_ends`` (with and without a planted in-graph event), each backend's
``shared_read_ends``, the release's prefill decision (0.5.23's resolver, snapshot path and
static path; 0.5.21's and 0.5.22's publisher), each algorithm's
prefill gate, and each worker's ``last_shared_read_runner`` for every fact combination. The
objects are built here by hand (:mod:`_real`), independently of warcore-sglang's oracle.

``python plugins/sglang/tests/_cells.py [--installed] > FILE`` (in the ``nox -s sglang``
venv, with ``PYTHONPATH=plugins/sglang/tests/_boot``) prints the table, tab-separated: sglang's
own answers, or (``--installed``) the answers with ``warcore_sglang.install()`` in force. The
before/after table of the bound-never-replace change was made with it
(``benchmarks/results/sglang_cells/``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from _real import (  # noqa: E402
    A,
    algorithm,
    bare,
    dots_swa_mla,
    hybrid,
    hybrid_linear,
    leaf,
    minimax_hybrid,
    prefill,
    tbo,
)

ALGORITHMS = (
    "none",
    "sglang_eagle",
    "sglang_eagle3",
    "sglang_standalone",
    "sglang_frozen_kv_mtp",
    "sglang_dflash",
    "sglang_dspark",
    "sglang_uno",
    "sglang_ngram",
)
"""Every ``SpeculativeAlgorithm`` member of the audited sglang releases, by warcore name."""


def backends(algo: Any) -> dict[str, Any]:
    """Each leaf and wrapper shape the matrix lists, bare, under ``algo``."""
    out = {
        name: leaf(name, algo)
        for name in ("base", "trtllm_mha", "dsv4", "triton", "flashinfer", "mamba2")
    }
    if importlib.util.find_spec(A + "minimax_sparse_nvfp4_backend") is not None:  # 0.5.23 only
        out["minimax_sparse_nvfp4"] = leaf("minimax_sparse_nvfp4", algo)
    out["hybrid(trtllm_mha,dsv4)"] = hybrid(leaf("trtllm_mha", algo), leaf("dsv4", algo), False)
    out["hybrid(trtllm_mha,dsv4,verify-on-decode)"] = hybrid(
        leaf("trtllm_mha", algo), leaf("dsv4", algo), True
    )
    out["tbo(dsv4)"] = tbo(lambda: leaf("dsv4", algo))
    out["hybrid_linear(flashinfer,mamba2)"] = hybrid_linear(
        leaf("flashinfer", algo), leaf("mamba2", algo)
    )
    out["dots_swa_mla(trtllm_mha)"] = dots_swa_mla(leaf("trtllm_mha", algo))
    out["minimax_hybrid(trtllm_mha)"] = minimax_hybrid(leaf("trtllm_mha", algo), algo)
    return out


def decode_runner(planted: bool) -> Any:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    return bare(
        DecodeCudaGraphRunner,
        in_graph_metadata_prep_done=object() if planted else None,
        model_runner=SimpleNamespace(shared_read_done_event=None),
    )


def _answer(function: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    try:
        value = function(*args, **kwargs)
    except Exception as exc:  # a bare object some path cannot run on: say so, as a cell
        return f"raises {type(exc).__name__}"
    return str(getattr(value, "name", value))


def worker_cases() -> Iterator[tuple[str, str, Any, bool, bool]]:
    """(algorithm, worker class name, worker class, has draft model, draft-extend staged) for
    every algorithm whose worker class imports here."""
    for name in ALGORITHMS:
        algo = algorithm(name)
        for staged in (False, True):
            try:
                if algo.is_none():
                    from sglang.srt.managers.tp_worker import TpModelWorker as klass
                else:
                    args = SimpleNamespace(
                        enable_multi_layer_eagle=staged, disable_overlap_schedule=False
                    )
                    klass = algo.create_worker(args)
            except Exception:
                continue  # uno (flashinfer), ngram (sgl_kernel): not importable on a CPU
            for has_draft in (True, False):
                yield name, klass.__qualname__, klass, has_draft, staged


def live_worker(klass: Any, algo: Any, has_draft: bool, staged: bool) -> tuple[Any, Any, Any]:
    """A worker of ``klass`` holding what its ``__init__`` and its step leave on it (the target
    worker and runner, the draft worker and its runner, the staged flag the multi-layer step
    sets), and its two runners."""
    target = SimpleNamespace(spec_algorithm=algo, shared_read_done_event=None)
    draft = SimpleNamespace(spec_algorithm=algo, shared_read_done_event=None)
    drafter = SimpleNamespace(
        draft_runner=draft, model_runner=draft, last_draft_extend_staged=staged
    )
    worker = bare(
        klass,
        _model_runner=target,
        model_runner=target,
        _target_worker=SimpleNamespace(model_runner=target),
        _draft_worker=drafter if has_draft else None,
    )
    return worker, target, draft


def _owner(klass: Any, algo: Any, has_draft: bool, staged: bool) -> str:
    worker, target, draft = live_worker(klass, algo, has_draft, staged)
    runner = worker.last_shared_read_runner
    return "target" if runner is target else "draft" if runner is draft else "none"


def cells() -> dict[str, str]:
    """Every cell -> its answer (a ``SharedReadEnds`` name, a bool, a runner, or ``raises``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    out: dict[str, str] = {}
    runners = {planted: decode_runner(planted) for planted in (True, False)}
    for name in ALGORITHMS:
        algo = algorithm(name)
        out[f"prefill_gate\t{name}"] = _answer(algo.supports_prefill_shared_read_done)
        for label, backend in backends(algo).items():
            for mode in ForwardMode:
                key = f"{label}\t{name}\t{mode.name}"
                out[f"shared_read_ends\t{key}"] = _answer(backend.shared_read_ends, mode)
                for planted, runner in runners.items():
                    out[f"decode(planted={planted})\t{key}"] = _answer(
                        runner._resolve_shared_read_ends, backend, mode
                    )
            for snapshot in (True, False):  # the release's own prefill decision point
                out[f"prefill(snapshot={snapshot})\t{label}\t{name}\tEXTEND"] = _answer(
                    prefill, backend, snapshot=snapshot
                )
    for name, klass_name, klass, has_draft, staged in worker_cases():
        key = f"owner\t{klass_name}\t{name}\tdraft={has_draft}\tstaged={staged}"
        out[key] = _answer(_owner, klass, algorithm(name), has_draft, staged)
    return out


def main(argv: list[str]) -> int:
    boot = Path(__file__).with_name("_boot")
    sys.path.insert(0, str(boot))
    import sitecustomize  # noqa: F401  (the triton/torchvision stand-ins)

    if "--installed" in argv:
        import warcore_sglang

        warcore_sglang.install()
    for key, value in sorted(cells().items()):
        print(f"{key}\t{value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
