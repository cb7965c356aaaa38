"""The audit of the installed vLLM's overlapped staging, on its real classes: ``python -m
warcore_vllm.audit`` (exit 1 when a check finds a violation in a configuration it audits; the
violations vLLM itself leaves are expected and reported,
:attr:`warcore_vllm.releases.VllmRelease.expected`; exit 2, one line, on a vLLM not audited).

One verdict per check and configuration, naming vLLM's class; which run on a release is that
release's data (:attr:`warcore_vllm.releases.VllmRelease.audits`):

* ``v1-event``: ``GPUModelRunner`` has its ``prepare_inputs_event`` whenever steps can overlap
  (``VllmConfig.max_concurrent_batches > 1``);
* ``v1-guard-scope``: in ``GPUModelRunner.execute_model`` and ``_dummy_run`` every write of a
  persistent host buffer (and each call that makes them) is inside ``synchronize_input_prep``;
* ``v1-host-buffers``: the host-buffer sanitizer over several overlapped steps of the real
  runner's input preparation (:mod:`warcore_vllm.audit._device`);
* ``v2-ring``: the V2 ``UvaBufferPool`` ring is deep enough for its uses per engine step times
  the steps in flight, every step kind released (:mod:`warcore_vllm.audit._v2`);
* ``encoder-ring``: ``MMEncoderModelRunner``'s guarded ring;
* ``deferred-free``: ``Scheduler`` returns a request's blocks only after the fence step's
  output (#45357), and ``swa-settled``: sliding-window blocks are freed on the settled basis
  (#47728) (:mod:`warcore_vllm.audit._sched`);
* ``ring-entry-points``, ``ring-user``, ``ring-step``, ``staged-by-reference``: the V2 staging
  ring on the V2 runner itself, every use of every slot through every entry point, per ring
  user and per step kind (:mod:`warcore_vllm.audit._v2checks`, :mod:`warcore_vllm.audit._kinds`);
* ``warmup``: each of vLLM's warmup functions, run as shipped (:mod:`warcore_vllm.audit._warmup`).

The package: this module (the checks, :func:`audit`, :func:`main`; ``__main__`` runs it) and
what they drive, vLLM's real code on a CPU: :mod:`._harness` (the configuration, the V1 runner,
the scheduler, the overlap loop), :mod:`._device` (the recording device), :mod:`._ring` (the V2
ring ledger), :mod:`._mrv2` (the V2 runner), :mod:`._v2` (the ring alone), :mod:`._steps`,
:mod:`._kinds`, :mod:`._drafter`, :mod:`._staged`, :mod:`._v2checks`, :mod:`._warmup`,
:mod:`._sched`; :mod:`._variants` (a method with one guard taken out) and :mod:`._verdict`. The
activation imports none of it; it imports the activation only for ``--activated``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace

from ..gate import current
from ..releases import VllmRelease
from . import _harness, _kinds, _sched, _v2, _v2checks, _warmup
from ._device import RecordingDevice
from ._harness import Configuration
from ._variants import method_source
from ._verdict import NOT_NEEDED, SOUND, VIOLATION, Verdict

__all__ = ["CHECK_FUNCTIONS", "Verdict", "audit", "checks", "main", "report", "run_check"]

RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"


def v1_event(cfg: Configuration) -> Verdict:
    device = RecordingDevice()
    with device.installed():
        runner, vc = _harness.build_v1(cfg, device)
    overlap = vc.max_concurrent_batches
    event = runner.prepare_inputs_event
    if overlap <= 1:
        verdict, detail = NOT_NEEDED, "max_concurrent_batches 1: no step overlaps another"
    elif event is None:
        with device.installed():
            waits = _input_preparation_waits(runner, device)
        verdict = SOUND if waits else VIOLATION
        detail = (
            f"max_concurrent_batches {overlap} but prepare_inputs_event is None (created only "
            "under async scheduling): "
        )
        detail += (
            f"each input preparation first waits for the device ({waits} device synchronizes "
            "in 2 of them): the previous step's copies are done before their sources change"
            if waits
            else "the pinned input buffers are rewritten while the previous step's copies may "
            "still read them (vLLM #47644, open)"
        )
    else:
        verdict = SOUND
        detail = f"max_concurrent_batches {overlap}, prepare_inputs_event present"
    return Verdict("v1-event", RUNNER, cfg.name, verdict, detail)


def _input_preparation_waits(runner: object, device: RecordingDevice, preparations: int = 2) -> int:
    """How many device synchronizes ``preparations`` of the runner's input preparation make
    (its ``synchronize_input_prep`` entered and left, as ``execute_model`` does): one each, or
    none (a synchronize per preparation is the coarse guard)."""
    before = device.syncs
    for _ in range(preparations):
        with runner.synchronize_input_prep():  # type: ignore[attr-defined]
            pass
    waits = device.syncs - before
    return waits if waits >= preparations else 0


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

V1_CONFIGURATIONS = {
    "default": _harness.DEFAULT,
    "synchronous": _harness.SYNC,
    "#47644": _harness.PP_NO_ASYNC,
}
V2_CONFIGURATIONS = {
    "default": V2_DEFAULT,
    "pipeline parallel": V2_PP,
    "DP idle rank (modelled)": V2_DP_DUMMY,
}
SCHEDULER_CONFIGURATIONS = {"KV consumer": KV_CONSUMER, "default": _harness.DEFAULT}

CHECK_FUNCTIONS: dict[str, Callable[[str], Verdict]] = {
    "v1-event": lambda key: v1_event(V1_CONFIGURATIONS[key]),
    "v1-guard-scope": lambda key: guard_scope(_runner_class()),
    "v1-host-buffers": lambda key: v1_host_buffers(V1_CONFIGURATIONS[key]),
    "v2-ring": lambda key: v2_ring(V2_CONFIGURATIONS[key]),
    "encoder-ring": lambda key: encoder_ring(),
    "deferred-free": lambda key: deferred_free(SCHEDULER_CONFIGURATIONS[key]),
    "swa-settled": lambda key: swa_settled(SWA),
    "ring-entry-points": lambda key: _v2checks.entry_point_check(),
    "ring-user": _v2checks.ring_user,
    "ring-step": _kinds.ring_step,
    "warmup": _warmup.warmup,
    "staged-by-reference": lambda key: _v2checks.staged_by_reference(),
}
"""Check -> its function of the configuration, as a release's
:attr:`~warcore_vllm.releases.VllmRelease.audits` names it: which (check, configuration) pairs
run on a release, and which of their violations vLLM itself leaves
(:attr:`~warcore_vllm.releases.VllmRelease.expected`), are that release's data."""


def checks() -> tuple[tuple[str, str], ...]:
    """(check, configuration) of the installed release, in the order the audit runs them."""
    return current().audits


def run_check(check: str, key: str) -> Verdict:
    return replace(CHECK_FUNCTIONS[check](key), key=key)


def audit(*, activated: bool = False, skip: frozenset[str] = frozenset()) -> list[Verdict]:
    """Every check of the installed release (but those named in ``skip``), on vLLM's real
    classes; ``activated``: with warcore-vllm's activation installed
    (:func:`warcore_vllm.activation.install`, its real patches), then uninstalled."""
    _harness.preload()
    with _activation(activated):
        return [run_check(check, key) for check, key in checks() if check not in skip]


ACTIVATED_WITH: list[str] = []
"""What the activation of the last activated audit changed (its report's first line)."""


@contextlib.contextmanager
def _activation(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    from .. import activation

    activation.install()
    _v2checks.every_user_run.cache_clear()  # a run of the activated runner, not a cached one
    ACTIVATED_WITH[:] = activation.changes(first_runner=False)
    try:
        yield
    finally:
        activation.uninstall()
        _v2checks.every_user_run.cache_clear()


def _said(verdict: Verdict, release: VllmRelease) -> Verdict:
    """A verdict of the activated audit, with what warcore did for it, or could not."""
    where = (verdict.check, verdict.key)
    if verdict.verdict == SOUND and where in release.fixes:
        return replace(
            verdict, detail=f"{verdict.detail}; made sound by warcore: {release.fixes[where]}"
        )
    if verdict.verdict == VIOLATION and where in release.unfixable:
        return replace(
            verdict,
            detail=f"{verdict.detail}; left as vLLM ships it (warcore "
            f"cannot fix it: {release.unfixable[where]})",
        )
    return verdict


def _summary(verdicts: list[Verdict], release: VllmRelease, activated: bool) -> str:
    found = [v for v in verdicts if v.verdict == VIOLATION]
    expected = release.unfixable if activated else release.expected
    known = sorted(
        {release.expected[v.check, v.key] for v in found if (v.check, v.key) in expected}
    )
    count = sum((v.check, v.key) in expected for v in found)
    which = "warcore cannot fix" if activated else "expected"
    text = (
        f"{len(verdicts)} verdicts: {sum(v.verdict == SOUND for v in verdicts)} sound, "
        f"{len(found)} violations ({count} {which}: {'; '.join(known) or 'none'}), "
        f"{sum(v.verdict == NOT_NEEDED for v in verdicts)} not needed"
    )
    if activated:
        fixed = sum(v.verdict == SOUND and (v.check, v.key) in release.fixes for v in verdicts)
        text += f"; {fixed} of vLLM's {len(release.expected)} violations made sound by warcore"
    return text


def report(verdicts: list[Verdict], *, activated: bool = False) -> tuple[int, str]:
    """The command's exit status and output for ``verdicts`` of the installed release (exit 1
    on a violation the release does not expect: with ``activated``, only those warcore cannot
    fix are)."""
    from ..gate import installed_version

    release = current()
    expected = release.unfixable if activated else release.expected
    header = f"warcore-vllm audit of vLLM {installed_version()} ({', '.join(release.staging)})"
    if activated:
        header += f", warcore active: {'; '.join(ACTIVATED_WITH)}"
        verdicts = [_said(v, release) for v in verdicts]
    lines = [header, *(v.line() for v in verdicts), _summary(verdicts, release, activated)]
    unexpected = [
        v for v in verdicts if v.verdict == VIOLATION and (v.check, v.key) not in expected
    ]
    return (1 if unexpected else 0), "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from ..gate import gate_problems

    parser = argparse.ArgumentParser(
        prog="python -m warcore_vllm.audit",
        description="Audit the installed vLLM's reuse of the buffers a step's copies read, on "
        "its real classes (no GPU, no model weights). Exit 0: every verdict as expected; 1: an "
        "unexpected violation; 2: not an audited vLLM (one line).",
    )
    parser.add_argument(
        "--activated",
        action="store_true",
        help="audit the activated configuration: warcore-vllm's activation installed (its real "
        "patches); expected violations are then only those warcore cannot fix",
    )
    args = parser.parse_args(argv)
    problems = gate_problems()
    if problems:
        print("NOT AUDITED: " + "; ".join(problems))
        return 2
    status, text = report(audit(activated=args.activated), activated=args.activated)
    print(text, end="")
    return status
