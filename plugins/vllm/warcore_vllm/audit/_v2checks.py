"""The staging-ring checks on vLLM's V2 runner (:mod:`warcore_vllm.audit._mrv2`), one verdict per
ring user and per step kind: every use of a slot per step, through every entry point the
pool has, against its depth and the steps in flight, and the slot reads of each step held
until its release point (:mod:`warcore_vllm.audit._ring`).

* ``ring-entry-points``: the pool's entry points read from its code are those the release
  declares (:attr:`warcore_vllm.releases.VllmRelease.entry_points`), and what counting
  ``copy_to_uva`` alone would miss;
* ``ring-user``: each ring user in the runner that holds every optional one, over six normal
  serving steps (a new request in each: every new-request pool used every step);
* ``ring-step``: each step kind (:data:`warcore_vllm.audit._kinds.STEP_KINDS`).
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..gate import current
from . import _mrv2, _steps
from ._device import RecordingDevice
from ._mrv2 import V2, Shape
from ._ring import RingLedger, cpu_uva, entry_points
from ._verdict import NOT_NEEDED, SOUND, VIOLATION, Verdict

__all__ = ["RingRun", "entry_point_check", "every_user_run", "kind_verdict", "ring_user", "run"]

RUNNER = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
POOL = "vllm.v1.worker.gpu.buffer_utils.UvaBufferPool"
STEPS = 6


@dataclass
class RingRun:
    """What one run of a runner found."""

    ledger: RingLedger
    device: RecordingDevice
    batches: int
    depth: int
    steps: int


def run(
    shape: Shape, plan: Callable[[V2], None], setup: Callable[[V2], None] | None = None
) -> RingRun:
    """Build the runner for ``shape`` and drive it with ``plan``, under the ledger."""
    release = current()
    users = frozenset(u.name for u in release.ring_users)
    device = RecordingDevice(sanitize=False)
    ledger = RingLedger(device, release.entry_points)
    with device.installed(), cpu_uva(uva=shape.uva) as buffers, ledger.installed():
        v2 = _mrv2.build(shape, device, ledger, users)
        if setup is not None:
            setup(v2)
        plan(v2)
        depth = int(buffers._DEFAULT_MAX_CONCURRENCY)
    return RingRun(ledger, device, v2.batches, depth, v2.step)


def _serving(count: int = STEPS, groups: int = 1) -> Callable[[V2], None]:
    return lambda v2: _mrv2.serve(v2, _steps.serving(count, groups))


def every_user_shape() -> Shape:
    return Shape(
        "every ring user",
        kv_groups=2,
        every_user=True,
        custom_logits_processors=current().custom_logits_processors,
    )


@functools.cache
def every_user_run() -> RingRun:
    """Six normal steps of the runner holding every ring user (cached: one run serves every
    ``ring-user`` verdict and the normal step's)."""
    return run(every_user_shape(), _serving(groups=2))


def _detail(
    ring: RingRun, owner: str | None, kind: str | None = None, late: bool = False
) -> tuple[bool, str]:
    """(any violation, the counts) of ``owner``'s uses (all: ``None``), of one step kind;
    ``late``: a reader of the step's slots runs after its release (one step more in flight)."""
    uses = [u for u in ring.ledger.uses if owner in (None, u.owner) and kind in (None, u.kind)]
    pools = {u.pool for u in uses}
    found = [v for v in ring.device.violations if owner is None or v.buffer in pools]
    per_step = Counter((u.step, u.pool) for u in uses)
    most = max(per_step.values(), default=0)
    entries = ", ".join(f"{n} {e}" for e, n in sorted(Counter(u.entry for u in uses).items()))
    text = (
        f"depth {ring.depth}, batch queue {ring.batches}: {len(pools)} pools, {len(uses)} uses "
        f"in {len({u.step for u in uses})} of {ring.steps} steps ({entries or 'none'}), at most "
        f"{most} per pool per step: needs {most * (ring.batches + late)}"
    )
    if late:
        text += " (a reader after the step's release: one step more in flight)"
    if found:
        return (
            True,
            f"{text}; {len(found)} slot reads rewritten in flight, first: {found[0].describe()}",
        )
    return False, f"{text}; no slot rewritten while a read of it was in flight"


def ring_user(name: str, ring: RingRun | None = None) -> Verdict:
    ring = ring if ring is not None else every_user_run()
    user = next(u for u in current().ring_users if u.name == name)
    if user.audited == "read":
        return _read_user(user.name, user.module)
    if not any(u.owner == name for u in ring.ledger.uses):
        detail = f"no use in {ring.steps} steps of the runner that holds it"
        return Verdict("ring-user", name, "normal steps", NOT_NEEDED, detail)
    bad, detail = _detail(ring, name)
    verdict = VIOLATION if bad else SOUND
    return Verdict("ring-user", name, "normal steps (async, PP 1)", verdict, detail, key=name)


def _read_user(name: str, module: str) -> Verdict:
    """A ring user whose module does not import here: its uses per call, read from its
    source file (the ``copy_to_uva`` calls on each of its tensors in each method)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    most, methods = 0, 0
    for method in cls.body:
        if isinstance(method, ast.FunctionDef):
            calls = Counter(
                ast.unparse(sub.func.value)
                for sub in ast.walk(method)
                if isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "copy_to_uva"
            )
            methods += bool(calls)
            most = max(most, max(calls.values(), default=0))
    verdict = SOUND if most <= 1 else VIOLATION
    detail = (
        f"read from the code, not run ({module} does not import here): {methods} methods stage, "
        f"at most {most} copy_to_uva of one tensor in each, one sampling call per step, read by "
        "its kernels before AsyncOutput: within the depth rule"
    )
    return Verdict("ring-user", name, "read from the code", verdict, detail, key=name)


def entry_point_check() -> Verdict:
    import vllm.v1.worker.gpu.buffer_utils as buffers

    found = entry_points(buffers.UvaBufferPool)
    declared = current().entry_points
    ring = every_user_run()
    counted = Counter(u.entry for u in ring.ledger.uses)
    missed = sum(n for e, n in counted.items() if e != "copy_to_uva")
    detail = (
        f"{' and '.join(found)}: {'each advances' if len(found) > 1 else 'advances'} the round "
        "robin (read from UvaBufferPool's code); in "
        f"{ring.steps} steps of every ring user, {missed} of {sum(counted.values())} uses come "
        "through an entry point other than copy_to_uva (a count of copy_to_uva alone misses them)"
    )
    if set(found) != set(declared):
        detail = f"declared {', '.join(declared)} but the code has {', '.join(found)}: {detail}"
        return Verdict("ring-entry-points", POOL, "UvaBufferPool", VIOLATION, detail)
    return Verdict("ring-entry-points", POOL, "UvaBufferPool", SOUND, detail)


def kind_verdict(
    key: str, ring: RingRun, kind: str | None, extra: str = "", late: bool = False
) -> Verdict:
    bad, detail = _detail(ring, None, kind, late)
    if extra:
        detail = f"{extra}; {detail}"
    return Verdict("ring-step", RUNNER, key, VIOLATION if bad else SOUND, detail, key=key)


def staged_by_reference() -> Verdict:
    """``stage_write``'s by-reference arrays: every host write to one between ``stage_write``
    and its ``apply_write``, traced in six steps of the runner holding every ring user (M-RoPE
    among them: its positions are the one array vLLM stages), with vLLM's callers listed."""
    from . import _staged

    trace = _staged.Trace()
    with trace.installed():
        ring = run(every_user_shape(), _serving(groups=2))
    device = RecordingDevice(sanitize=False)
    with device.installed(), cpu_uva(), RingLedger(device, current().entry_points).installed():
        kept = _staged.by_reference()
    sites = _staged.call_sites()
    ran = ", ".join(
        f"{where} ({', '.join(f'{n} {kind}' for kind, n in sorted(kinds.items()))})"
        for where, kinds in sorted(trace.staged.items())
    )
    others = ", ".join(
        f"{Path(site.path).name}:{site.line} ({site.argument})"
        for site in sites
        if f"{Path(site.path).name}:{site.line}" not in trace.staged
    )
    detail = (
        f"stage_write keeps an array {'by reference' if kept else 'as a copy'} (run: staged "
        f"[10, 11, 12], then set to 99, applied {'99' if kept else '[10, 11, 12]'}); "
        f"{len(sites)} stage_write calls in the wheel, {len(trace.staged)} run here over "
        f"{ring.steps} steps of every ring user: {ran}; not run here (argument as written): "
        f"{others or 'none'}"
    )
    key = "stage_write callers"
    cls = "vllm.v1.worker.gpu.buffer_utils.StagedWriteTensor"
    if trace.changed:
        detail += f"; {len(trace.changed)} written before apply_write, first: {trace.changed[0]}"
        return Verdict("staged-by-reference", cls, key, VIOLATION, detail)
    arrays = sum(trace.arrays().values())
    detail += f"; none of the {arrays} staged arrays written between stage_write and apply_write"
    return Verdict("staged-by-reference", cls, key, SOUND, detail)
