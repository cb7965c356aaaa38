"""``python -m warcore_sglang.serving.bench``: sglang's per-execute resolution against warcore's
lookup.

``DecodeCudaGraphRunner.execute`` resolves where the forward's shared reads end on every
replay: sglang calls ``_resolve_shared_read_ends(attn_backend, mode)``, which asks the
backend's ``shared_read_ends(mode)`` (through ``super()`` for ``trtllm_mha``). With warcore-sglang
installed the same method answers from the runner's remembered answers (two attribute reads
and an identity test for the mode it last remembered; sglang's own answer and warcore's are
bounded once, on the first call). This
measures both, in one run, on the same objects: a bare ``DecodeCudaGraphRunner`` per case
holding what sglang's constructor and capture leave (its backend, no pdmux, a planted in-graph
event) and bare backends (``object.__new__``, the attributes the methods read).

The floor, measured in the same run: the same call on a bare runner of a subclass whose
``_resolve_shared_read_ends`` is an empty Python method (``return forward_mode``). Nothing
written in Python at that call site can cost less (the call itself, and the ``lambda`` the
timing wraps it in, are in every number). The goal is warcore's answer within :data:`GOAL`
times the floor in every case.

Each of ``--repeat`` rounds times every case's floor, sglang's own (uninstalled) and warcore's
(installed, its cache warmed by one call), one after the other, ``--calls`` calls each; the
best of the rounds is kept. Interleaving them means a machine that gets busier or quieter moves
all three alike (these machines are shared and noisy).

On a CPU-only machine sglang needs import-only stand-ins for triton and torchvision:
``PYTHONPATH=plugins/sglang/tests/_boot python -m warcore_sglang.serving.bench``.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import timeit
from types import SimpleNamespace
from typing import Any

from warcore.cli import JsonOutput, Limit

__all__ = ["GOAL", "main", "measure"]

GOAL = 1.25
"""warcore's per-replay answer costs at most this many times an empty Python method."""


def _cases() -> list[tuple[str, Any, Any]]:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def bare(cls: type, algo: Any) -> Any:
        obj: Any = object.__new__(cls)
        obj.model_runner = SimpleNamespace(spec_algorithm=algo)
        return obj

    eagle = SpeculativeAlgorithm.EAGLE
    return [
        ("base (AttentionBackend), DECODE", bare(AttentionBackend, eagle), ForwardMode.DECODE),
        ("trtllm_mha, DECODE (super() path)", bare(TRTLLMHAAttnBackend, eagle), ForwardMode.DECODE),
        (
            "trtllm_mha, TARGET_VERIFY",
            bare(TRTLLMHAAttnBackend, eagle),
            ForwardMode.TARGET_VERIFY,
        ),
        (
            "dsv4 under EAGLE, TARGET_VERIFY",
            bare(DeepseekV4AttnBackend, eagle),
            ForwardMode.TARGET_VERIFY,
        ),
    ]


def _best(call: Any, calls: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=calls, repeat=repeat)) / calls * 1e9


def _runner_classes() -> tuple[type, type]:
    """(sglang's decode runner; a subclass whose ``_resolve_shared_read_ends`` is an empty
    method: the floor of any Python answer)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    class FloorRunner(DecodeCudaGraphRunner):  # type: ignore[misc]
        def _resolve_shared_read_ends(self, attn_backend: Any, forward_mode: Any) -> Any:
            return forward_mode

    return DecodeCudaGraphRunner, FloorRunner


def _runner(cls: type, backend: Any) -> Any:
    """A bare runner holding what sglang's constructor and capture leave that resolution reads:
    its backend (set once; no pdmux), a planted in-graph event, its model runner's mailbox."""
    runner: Any = object.__new__(cls)
    runner.attn_backend = backend
    runner.enable_pdmux = False
    runner.in_graph_metadata_prep_done = object()
    runner.model_runner = SimpleNamespace(shared_read_done_event=None)
    return runner


def _timed(cls: type, case: tuple[str, Any, Any], calls: int) -> tuple[float, Any]:
    """(ns per call of ``_resolve_shared_read_ends`` on a fresh runner of ``cls`` for one case,
    in one timing run, its answer); a first call (which resolves and fills the caches) is not
    timed."""
    _, backend, mode = case
    runner = _runner(cls, backend)
    answer = runner._resolve_shared_read_ends(backend, mode)
    ns = _best(lambda: runner._resolve_shared_read_ends(backend, mode), calls, 1)
    return ns, answer


def _rounds(cases: list[Any], calls: int, repeat: int) -> Any:
    """``repeat`` rounds, each timing the floor, sglang's own and warcore's of every case one
    after the other (installing and uninstalling around warcore's), so that a machine that
    gets busier or quieter moves all three alike; the best of each is kept."""
    import warcore_sglang

    sglang_cls, floor_cls = _runner_classes()
    best: dict[str, list[tuple[float, Any]]] = {"floor": [], "own": [], "ours": []}
    for _ in range(repeat):
        floor = [_timed(floor_cls, case, calls) for case in cases]
        own = [_timed(sglang_cls, case, calls) for case in cases]
        warcore_sglang.install()
        try:
            ours = [_timed(sglang_cls, case, calls) for case in cases]
        finally:
            warcore_sglang.uninstall()
        for key, got in (("floor", floor), ("own", own), ("ours", ours)):
            kept = best[key] or got
            best[key] = [min(a, b) for a, b in zip(kept, got, strict=True)]
    return best["floor"], best["own"], best["ours"]


def _row(label: str, own: tuple[float, Any], ours: tuple[float, Any], floor: float) -> Any:
    (sglang_ns, sglang_answer), (warcore_ns, answer) = own, ours
    return {
        "case": label,
        "sglang_ns": round(sglang_ns, 1),
        "warcore_ns": round(warcore_ns, 1),
        "ratio": round(warcore_ns / sglang_ns, 3),
        "floor_ns": round(floor, 1),
        "warcore_over_floor": round(warcore_ns / floor, 3),
        "sglang_answer": sglang_answer.name,
        "warcore_answer": answer.name,
    }


def _geomean(values: list[float]) -> float:
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 3)


def measure(calls: int = 200_000, repeat: int = 5) -> dict[str, Any]:
    """Run the benchmark; returns what ``--json`` writes."""
    import sglang
    import torch

    import warcore
    import warcore_sglang

    if warcore_sglang.is_installed():
        raise RuntimeError("uninstall warcore-sglang first: sglang's own code is measured first")
    cases = _cases()
    floors, own, ours = _rounds(cases, calls, repeat)
    floors = [ns for ns, _ in floors]
    labels = [label for label, _, _ in cases]
    results = [_row(*row) for row in zip(labels, own, ours, floors, strict=True)]
    ratios = [r["ratio"] for r in results]
    return {
        "benchmark": "sglang DecodeCudaGraphRunner._resolve_shared_read_ends: the installed "
        "sglang's own per-execute resolution vs warcore-sglang's installed lookup, same objects",
        "calls": calls,
        "repeat": repeat,
        "cases": results,
        "geomean_ratio": _geomean(ratios),
        "max_ratio": max(ratios),
        "max_over_floor": max(r["warcore_over_floor"] for r in results),
        "within_goal": max(r["warcore_over_floor"] for r in results) <= GOAL,
        "versions": {
            "sglang": sglang.__version__,
            "warcore": warcore.__version__,
            "warcore_sglang": warcore_sglang.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": f"{platform.machine()}, {platform.processor() or '-'}, {platform.system()}",
    }


CALLS = Limit(int, 1, 10_000_000)
REPEAT = Limit(int, 1, 1_000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warcore_sglang.serving.bench", description=__doc__
    )
    parser.add_argument("--calls", type=CALLS, default=200_000, help="calls per timing run")
    parser.add_argument("--repeat", type=REPEAT, default=5, help="timing runs per case (best kept)")
    parser.add_argument("--json", metavar="FILE", help="also write the result to FILE")
    args = parser.parse_args(argv)
    output = JsonOutput(parser, args.json)
    result = measure(args.calls, args.repeat)
    result["command"] = "python -m warcore_sglang.serving.bench " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    width = max(len(c["case"]) for c in result["cases"])
    print(f"{'case':<{width}}  sglang ns  warcore ns  ratio  floor ns  warcore/floor  answer")
    for c in result["cases"]:
        same = (
            c["sglang_answer"]
            if c["sglang_answer"] == c["warcore_answer"]
            else (f"{c['sglang_answer']} -> {c['warcore_answer']}")
        )
        print(
            f"{c['case']:<{width}}  {c['sglang_ns']:>9.1f}  {c['warcore_ns']:>10.1f}  "
            f"{c['ratio']:>5.3f}  {c['floor_ns']:>8.1f}  {c['warcore_over_floor']:>13.3f}  {same}"
        )
    print(
        f"warcore / sglang: geometric mean {result['geomean_ratio']}, max {result['max_ratio']}; "
        f"warcore / floor (an empty Python method): max {result['max_over_floor']} "
        f"(goal: at most {GOAL})"
    )
    return output.write(result)


if __name__ == "__main__":
    from warcore.cli import run_command

    raise SystemExit(run_command("python -m warcore_sglang.serving.bench", main))
