"""The audit of vLLM 0.33.0's overlapped staging, on its real classes: ``python -m
warcore_vllm.audit`` (exit 1 when a check finds a violation in a configuration it audits; the
violations of configurations vLLM itself leaves unguarded are expected and reported, see
:data:`EXPECTED`).

One verdict per check and configuration, naming vLLM's class:

* ``v1-event``: ``GPUModelRunner`` has its ``prepare_inputs_event`` whenever steps can overlap
  (``VllmConfig.max_concurrent_batches > 1``);
* ``v1-guard-scope``: in ``GPUModelRunner.execute_model`` and ``_dummy_run`` every write of a
  persistent host buffer (and each call that makes them) is inside ``synchronize_input_prep``;
* ``v1-host-buffers``: the host-buffer sanitizer over several overlapped steps of the real
  runner's input preparation (:mod:`warcore_vllm._device`);
* ``v2-ring``: the V2 ``UvaBufferPool`` ring is deep enough for its uses per engine step times
  the steps in flight, every step kind released (:mod:`warcore_vllm._v2`);
* ``encoder-ring``: ``MMEncoderModelRunner``'s guarded ring;
* ``deferred-free``: ``Scheduler`` returns a request's blocks only after the fence step's
  output (#45357), and ``swa-settled``: sliding-window blocks are freed on the settled basis
  (#47728) (:mod:`warcore_vllm._sched`).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import _harness, _sched, _v2
from ._device import RecordingDevice
from ._harness import Configuration
from ._names import STAGING
from ._variants import method_source

__all__ = ["CHECKS", "EXPECTED", "Verdict", "audit", "main"]

SOUND, VIOLATION, NOT_NEEDED = "sound", "VIOLATION", "not needed"
RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"


@dataclass(frozen=True)
class Verdict:
    check: str
    cls: str
    configuration: str
    verdict: str
    detail: str

    def line(self) -> str:
        return (
            f"{self.verdict:<10} {self.check:<16} {self.cls} [{self.configuration}]: {self.detail}"
        )


def v1_event(cfg: Configuration) -> Verdict:
    device = RecordingDevice()
    with device.installed():
        runner, vc = _harness.build_v1(cfg, device)
    overlap = vc.max_concurrent_batches
    event = runner.prepare_inputs_event
    if overlap <= 1:
        verdict, detail = NOT_NEEDED, "max_concurrent_batches 1: no step overlaps another"
    elif event is None:
        verdict = VIOLATION
        detail = (
            f"max_concurrent_batches {overlap} but prepare_inputs_event is None (created only "
            "under async scheduling): the pinned input buffers are rewritten while the "
            "previous step's copies may still read them (vLLM #47644, open)"
        )
    else:
        verdict = SOUND
        detail = f"max_concurrent_batches {overlap}, prepare_inputs_event present"
    return Verdict("v1-event", RUNNER, cfg.name, verdict, detail)


WRITERS = frozenset({"_update_states", "_prepare_inputs", "_preprocess", "copy_to_gpu"})
"""Calls that write (or copy from) the persistent host buffers: the runner's two staging
methods, its multimodal preprocessing, and a ``CpuGpuBuffer``'s host-to-device copy."""


def _guard_blocks(func: ast.FunctionDef) -> list[ast.With]:
    return [
        node
        for node in ast.walk(func)
        if isinstance(node, ast.With)
        and any("synchronize_input_prep" in ast.unparse(i.context_expr) for i in node.items)
    ]


def _writes(node: ast.AST) -> Iterator[tuple[int, str]]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in WRITERS:
                yield sub.lineno, ast.unparse(sub.func)
        elif isinstance(sub, ast.Assign | ast.AugAssign):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            for target in targets:
                text = ast.unparse(target)
                if isinstance(target, ast.Subscript) and (".np[" in text or ".cpu[" in text):
                    yield sub.lineno, text


def guard_scope(cls: type, names: tuple[str, ...] = ("execute_model", "_dummy_run")) -> Verdict:
    """Every write of :data:`WRITERS` in the methods lies inside a ``with`` of
    ``synchronize_input_prep`` (read from the methods' source as vLLM ships it)."""
    outside: list[str] = []
    for name in names:
        func = method_source(cls, name)
        guards = _guard_blocks(func)
        if not guards:
            outside.append(f"{name}: no synchronize_input_prep block")
            continue
        inside = {(line, text) for g in guards for line, text in _writes(g)}
        outside += [f"{name}: {t} (line +{n})" for n, t in _writes(func) if (n, t) not in inside]
    verdict = VIOLATION if outside else SOUND
    detail = (
        "outside the guard: " + "; ".join(outside)
        if outside
        else f"every staging write of {', '.join(names)} is inside synchronize_input_prep"
    )
    return Verdict("v1-guard-scope", RUNNER, "any", verdict, detail)


def v1_host_buffers(cfg: Configuration, steps: int = 6) -> Verdict:
    device = RecordingDevice()
    with device.installed():
        runner, vc = _harness.build_v1(cfg, device)
        run = _harness.run_v1(_harness.V1Run(runner, vc, device), steps=steps)
    seen = {(v.buffer, v.step) for v in device.violations}
    first = device.violations[0].describe() if device.violations else ""
    counts = (
        f"{run.steps} steps, {device.reads} host-to-device reads of {len(device.host)} "
        f"persistent host buffers, {device.poisoned_releases} release points poisoned"
    )
    if seen:
        return Verdict(
            "v1-host-buffers",
            RUNNER,
            cfg.name,
            VIOLATION,
            f"{counts}; {len(seen)} buffer reads rewritten in flight, first: {first}",
        )
    return Verdict("v1-host-buffers", RUNNER, cfg.name, SOUND, f"{counts}; nothing changed")


POOL = "vllm.v1.worker.gpu.buffer_utils.UvaBufferPool"


def v2_ring(cfg: _v2.V2Configuration) -> Verdict:
    device = RecordingDevice(sanitize=False)
    with device.installed():
        batches, depth = _v2.v2_ring(cfg, device)
    uses = 1 + cfg.dummy_runs_per_step
    detail = (
        f"depth {depth}, batch queue {batches}, {uses} use(s) per engine step "
        f"({cfg.dummy_runs_per_step} without a release): needs {uses * batches}"
    )
    if device.violations:
        first = device.violations[0].describe()
        return Verdict("v2-ring", POOL, cfg.describe(), VIOLATION, f"{detail}; {first}")
    return Verdict("v2-ring", POOL, cfg.describe(), SOUND, detail + "; no slot rewritten in use")


def encoder_ring() -> Verdict:
    device = RecordingDevice(sanitize=False)
    with device.installed():
        depth = _v2.encoder_ring(device)
    cls = "vllm.v1.worker.mm_encoder_model_runner.MMEncoderModelRunner"
    config = "encoder-only instance, max_concurrent_batches 2"
    if device.violations:
        return Verdict("encoder-ring", cls, config, VIOLATION, device.violations[0].describe())
    detail = f"ring depth {depth}, input_tensor_semaphore released every slot before reuse"
    return Verdict("encoder-ring", cls, config, SOUND, detail)


SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"


def deferred_free(cfg: Configuration) -> Verdict:
    report = _sched.deferred_free(cfg)
    if not cfg.kv_consumer:
        detail = (
            "no KV consumer: a freed block is written next by a later forward, ordered by "
            f"the stream (defer_block_free={report.deferred})"
        )
        return Verdict("deferred-free", SCHEDULER, cfg.describe(), NOT_NEEDED, detail)
    if report.problems:
        return Verdict("deferred-free", SCHEDULER, cfg.describe(), VIOLATION, report.problems[0])
    detail = (
        f"defer_block_free={report.deferred}; {report.checks} in-flight block checks over "
        f"{report.steps} steps (an abort with 2 steps in flight): none freed early"
    )
    return Verdict("deferred-free", SCHEDULER, cfg.describe(), SOUND, detail)


def swa_settled(cfg: Configuration) -> Verdict:
    report = _sched.swa_free(cfg)
    cls = "vllm.v1.core.kv_cache_manager.KVCacheManager"
    if report.problems:
        return Verdict("swa-settled", cls, cfg.describe(), VIOLATION, report.problems[0])
    detail = (
        f"{report.checks} in-flight window checks over {report.steps} steps: no block an "
        "in-flight step's window reads was freed"
    )
    return Verdict("swa-settled", cls, cfg.describe(), SOUND, detail)


def _runner_class() -> type:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner  # type: ignore[no-any-return]


V2_DEFAULT = _v2.V2Configuration("V2 default")
V2_PP = _v2.V2Configuration("V2 pipeline parallel", pipeline_parallel=2)
V2_DP_DUMMY = _v2.V2Configuration("V2 DP idle rank", dummy_runs_per_step=1)
KV_CONSUMER = Configuration("async + KV consumer", True, kv_consumer=True)
SWA = Configuration("async + sliding window", True, sliding_window=32)

CHECKS: list[tuple[str, Callable[[], Verdict]]] = [
    ("v1-event", lambda: v1_event(_harness.DEFAULT)),
    ("v1-event", lambda: v1_event(_harness.SYNC)),
    ("v1-event", lambda: v1_event(_harness.PP_NO_ASYNC)),
    ("v1-guard-scope", lambda: guard_scope(_runner_class())),
    ("v1-host-buffers", lambda: v1_host_buffers(_harness.DEFAULT)),
    ("v1-host-buffers", lambda: v1_host_buffers(_harness.SYNC)),
    ("v1-host-buffers", lambda: v1_host_buffers(_harness.PP_NO_ASYNC)),
    ("v2-ring", lambda: v2_ring(V2_DEFAULT)),
    ("v2-ring", lambda: v2_ring(V2_PP)),
    ("v2-ring", lambda: v2_ring(V2_DP_DUMMY)),
    ("encoder-ring", encoder_ring),
    ("deferred-free", lambda: deferred_free(KV_CONSUMER)),
    ("deferred-free", lambda: deferred_free(_harness.DEFAULT)),
    ("swa-settled", lambda: swa_settled(SWA)),
]

EXPECTED = {
    ("v1-event", _harness.PP_NO_ASYNC.name),
    ("v1-host-buffers", _harness.PP_NO_ASYNC.name),
    ("v2-ring", V2_DP_DUMMY.describe()),
}
"""(check, configuration) pairs vLLM 0.33.0 itself leaves unguarded, reported as violations on
purpose: #47644 (pipeline parallel without async scheduling, open) and the class of #54269
(a V2 step kind that stages a pool use without a release, modelled as an idle data-parallel
rank's dummy run; 0.33.0's own dummy run stages none, see :mod:`warcore_vllm._v2`)."""


def audit() -> list[Verdict]:
    _harness.preload()
    return [run() for _, run in CHECKS]


def main(argv: list[str] | None = None) -> int:
    from ._vllm import gate_problems, installed_version

    argparse.ArgumentParser(
        prog="python -m warcore_vllm.audit",
        description="Audit the installed vLLM's reuse of the buffers a step's copies read, on "
        "its real classes (no GPU, no model weights). Exit 0: every verdict as expected; 1: an "
        "unexpected violation; 2: not the audited vLLM.",
    ).parse_args(argv)

    print(f"warcore-vllm audit of vLLM {installed_version()} ({', '.join(STAGING)})")
    problems = gate_problems()
    if problems:
        print("NOT AUDITED: " + "; ".join(problems))
        return 2
    verdicts = audit()
    for verdict in verdicts:
        print(verdict.line())
    unexpected = [
        v for v in verdicts if v.verdict == VIOLATION and (v.check, v.configuration) not in EXPECTED
    ]
    found = sum(v.verdict == VIOLATION for v in verdicts)
    print(
        f"{len(verdicts)} verdicts: {sum(v.verdict == SOUND for v in verdicts)} sound, "
        f"{found} violations ({found - len(unexpected)} expected: vLLM #47644, #54269's class), "
        f"{sum(v.verdict == NOT_NEEDED for v in verdicts)} not needed"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
