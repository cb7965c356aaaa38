"""The WAR sanitizer inside a real sglang process.

A declaration says where a forward's last read of the scheduler-shared buffers ends; the
runner publishes its read-done event there, and the scheduler may overwrite those buffers as
soon as the event completes. The sanitizer makes every such overwrite happen at once: at each
publish point in the process (a model runner storing an event into its mailbox; see
:mod:`warcore_sglang.audit.observe`), it overwrites the batch's rows of every scheduler-shared
buffer with poison that still indexes valid memory, lets the forward finish, and restores
them. A forward that reads a buffer after its publish point reads the poison: its tokens
change. Comparing the tokens with an unpoisoned run of the same requests finds the
declarations that publish too early, named by backend, forward mode, record point and the
declaration's provenance.

The buffers (every audited sglang release):

* ``req_to_token_pool.req_to_token``: the rows of the batch's ``req_pool_indices``, each entry
  ``v`` replaced by ``(v + size // 2) % (size + 1)`` (``size``: the KV pool's slots), another
  slot of the same pool;
* ``token_to_kv_pool.full_to_swa_index_mapping`` where the pool has one (sliding-window
  models): the entries of the full slots those rows name, shifted the same way within the SWA
  pool (``size_swa``).

Switch it on with ``WARCORE_SGLANG_SANITIZE`` in the server's environment, with
``WARCORE_SGLANG_TRACE=FILE`` (its ``poison`` records go there):

* ``all``: every batch is poisoned at its publish points;
* ``tagged``: only batches holding a request whose ``rid`` starts with ``warcore-sanitize``
  (then one server runs a workload plain and again tagged, and the two are compared).

``python -m warcore_sglang.audit.sanitize`` does all of it: it starts sglang's ``Engine`` with the
sglang arguments it is given (and ``SGLANG_ENABLE_PREFILL_WAR_READ_DONE=1`` unless set, under
``WARCORE_SGLANG_PREFILL_SWITCH=own``, the default: the prefill fast path on, so that early
prefill declarations publish; see :mod:`warcore_sglang.settings`), runs a two-wave
workload (the second wave reuses the ``req_to_token`` rows the first freed) plain and then
tagged, and reports (exit 1 on a violation).

What it covers, and on which device:

* CPU (tested): sglang's eager prefill publish (``EagerRunner._execute_extend``, a backend
  declaring ``EXTEND`` ``PRE_REPLAY``); the forward runs synchronously in the scheduler's
  thread, so nothing else touches the buffers between poison and restore. A CPU run shows a
  read after the publish point even though, without the sanitizer, no race can happen there.
* CUDA (untested: no GPU was available): the same hook sees the decode graph runner's
  ``PRE_REPLAY`` and ``POST_REPLAY`` publishes and the EAGLE draft-extend runner's; the poison
  is enqueued on the forward stream right after the event's record, the restore after the
  forward, and the host then synchronizes the forward stream, so the scheduler's next writes
  come after the restore (the sanitizer costs the overlap; it is an audit). An ``IN_REPLAY``
  publish hands the in-graph event over after the replay, so poisoning there is too late: the
  in-graph point is not covered by this hook (it needs a poison node captured after sglang's
  in-graph marker).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import observe as _observe
from . import trace

__all__ = [
    "ENV_SANITIZE",
    "TAG",
    "Report",
    "Sanitizer",
    "compare",
    "install",
    "main",
    "poison_rows",
    "uninstall",
]

ENV_SANITIZE = "WARCORE_SGLANG_SANITIZE"
"""``all`` or ``tagged`` (see the module docstring); needs ``WARCORE_SGLANG_TRACE``."""
TAG = "warcore-sanitize"
"""``tagged`` mode poisons only batches holding a request whose rid starts with this."""
MODES = ("all", "tagged")


def _shift(values: Any, size: int) -> Any:
    """Another valid index of the same ``size + 1``-slot buffer for each value."""
    return (values + max(size // 2, 1)) % (size + 1)


def poison_rows(model_runner: Any, forward_batch: Any) -> list[tuple[str, Any, Any, Any]]:
    """Poison the batch's rows of every scheduler-shared buffer; returns what
    :func:`restore` puts back: ``(name, tensor, index, original values)``."""
    table = model_runner.req_to_token_pool.req_to_token
    rows = forward_batch.req_pool_indices.long()
    pool = model_runner.token_to_kv_pool
    size = int(pool.size)
    saved = table[rows].clone()
    table[rows] = _shift(saved, size).to(table.dtype)
    done: list[tuple[str, Any, Any, Any]] = [("req_to_token", table, rows, saved)]
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    if mapping is not None and hasattr(mapping, "index_put_") and mapping.numel():
        slots = saved.reshape(-1).long().unique()
        slots = slots[(slots >= 0) & (slots < mapping.shape[0])]
        original = mapping[slots].clone()
        swa_size = int(getattr(pool, "size_swa", int(mapping.max()) if mapping.numel() else 1))
        mapping[slots] = _shift(original, swa_size).to(mapping.dtype)
        done.append(("full_to_swa_index_mapping", mapping, slots, original))
    return done


def not_covered(model_runner: Any, done: list[tuple[str, Any, Any, Any]]) -> list[str]:
    """The scheduler-shared buffers this runner's model has and :func:`poison_rows` could not
    find: a sliding-window model's SWA index map that is not where the audited releases keep it
    (``token_to_kv_pool.full_to_swa_index_mapping``). Its reads are not checked."""
    pool = getattr(model_runner, "token_to_kv_pool", None)
    swa = bool(getattr(model_runner, "is_hybrid_swa", False)) or hasattr(pool, "size_swa")
    poisoned = {name for name, *_ in done}
    swa_map = "full_to_swa_index_mapping"
    return [swa_map] if swa and swa_map not in poisoned else []


def restore(done: list[tuple[str, Any, Any, Any]]) -> None:
    for _, tensor, index, original in reversed(done):
        tensor[index] = original


class Sanitizer(_observe.Listener):
    """Poisons at each publish of a batch it is asked to sanitize; restores at forward end."""

    name = "sanitizer"

    def __init__(self, trace_path: str, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"{ENV_SANITIZE}={mode!r}: expected one of {', '.join(MODES)}")
        self.trace_path = trace_path
        self.mode = mode
        self._poisoned: dict[int, tuple[Any, list[tuple[str, Any, Any, Any]]]] = {}
        self._lock = threading.Lock()

    def on_publish(self, publish: _observe.Publish) -> None:
        runner = publish.model_runner
        forward = _observe.current_forward(runner)
        if forward is None:
            return
        with self._lock:
            if id(runner) in self._poisoned:
                return  # already poisoned in this forward (an earlier publish of it)
        rids = [str(getattr(r, "rid", "")) for r in getattr(_observe.current_batch(), "reqs", [])]
        if self.mode == "tagged" and not any(r.startswith(TAG) for r in rids):
            return
        done = poison_rows(runner, forward)
        with self._lock:
            self._poisoned[id(runner)] = (runner, done)
        declared, why = trace.explain(runner, forward.forward_mode)
        trace.write_record(
            self.trace_path,
            {
                "kind": "poison",
                "pid": os.getpid(),
                "mode": trace._mode_name(forward.forward_mode),
                "record_point": publish.record_point,
                "publisher": publish.publisher,
                "backend": trace.backend_name(getattr(runner, "attn_backend", None)),
                "declared": declared,
                "provenance": why,
                "rids": rids,
                "buffers": [name for name, *_ in done],
                "not_covered": not_covered(runner, done),
                "rows": int(done[0][2].numel()),
            },
        )

    def on_forward_end(self, model_runner: Any, forward_batch: Any) -> None:
        with self._lock:
            entry = self._poisoned.pop(id(model_runner), None)
        if entry is None:
            return
        restore(entry[1])
        device = str(getattr(model_runner, "device", "cpu"))
        if device.startswith("cuda"):
            import torch

            # The scheduler's next writes must come after the restore: it waits only for the
            # (early) event, so the host waits for the forward stream here.
            torch.cuda.current_stream().synchronize()


def install(trace_path: str, mode: str) -> Sanitizer:
    """Sanitize this process's publishes (idempotent: a second call returns the first)."""
    return _observe.attach(Sanitizer(trace_path, mode))


def uninstall() -> None:
    _observe.detach(Sanitizer.name)


# -- the report -----------------------------------------------------------------------------


@dataclass
class Group:
    """The poisoned publishes of one (backend, mode, record point, provenance)."""

    backend: str
    mode: str
    record_point: str
    provenance: str
    declared: str
    publishes: int = 0
    requests: set[str] = field(default_factory=set)
    changed: set[str] = field(default_factory=set)
    """Requests of these batches whose tokens differ from their unpoisoned run."""
    not_covered: set[str] = field(default_factory=set)
    """Shared buffers the model has that could not be found to poison: not checked."""

    @property
    def violation(self) -> bool:
        return bool(self.changed)

    @property
    def verdict(self) -> str:
        if self.violation:
            return f"VIOLATION: {len(self.changed)} of {len(self.requests)} requests changed tokens"
        if self.not_covered:
            return (
                f"NOT COVERED: {', '.join(sorted(self.not_covered))} could not be found to "
                f"poison (its reads are not checked; {len(self.requests)} requests kept their "
                "tokens)"
            )
        return f"sound: all {len(self.requests)} requests kept their tokens"


@dataclass
class Report:
    groups: list[Group]
    unexplained: list[str]
    """Requests whose tokens differ though no batch of theirs was poisoned (nondeterminism:
    the comparison proves nothing then)."""
    compared: int

    @property
    def violations(self) -> list[Group]:
        return [g for g in self.groups if g.violation]

    @property
    def ok(self) -> bool:
        uncovered = any(g.not_covered for g in self.groups)
        return not self.violations and not self.unexplained and not uncovered

    def lines(self) -> list[str]:
        out = [f"sanitizer: {self.compared} requests compared with their unpoisoned run"]
        if not self.groups:
            out.append(
                "  no publish point was poisoned: nothing published before its forward ended"
            )
        for g in self.groups:
            out.append(
                f"  {g.backend} {g.mode} published at {g.record_point} (declared {g.declared}, "
                f"{g.provenance}): {g.publishes} publishes poisoned; {g.verdict}"
            )
        if self.unexplained:
            out.append(
                f"  INCONCLUSIVE: {len(self.unexplained)} requests changed tokens without a "
                f"poisoned batch: {', '.join(sorted(self.unexplained)[:5])}"
            )
        return out


def compare(
    records: list[dict[str, Any]],
    plain: dict[str, list[int]],
    poisoned: dict[str, list[int]],
    twin: Any = None,
) -> Report:
    """Which poisoned publishes changed tokens. ``plain`` and ``poisoned`` map request ids to
    output ids; ``twin(poisoned_rid)`` names its plain request (default: the rid without the
    :data:`TAG` prefix and its ``-``)."""

    def plain_of(rid: str) -> str:
        if twin is not None:
            return str(twin(rid))
        return rid[len(TAG) + 1 :] if rid.startswith(TAG + "-") else rid

    changed = {rid for rid, ids in poisoned.items() if plain.get(plain_of(rid)) != ids}
    groups: dict[tuple[str, str, str, str], Group] = {}
    covered: set[str] = set()
    for r in records:
        if r.get("kind") != "poison":
            continue
        key = (r["backend"], r["mode"], r["record_point"], r["provenance"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = Group(*key, declared=r.get("declared", "?"))
        g.publishes += 1
        g.not_covered |= set(r.get("not_covered", []))
        rids = set(r.get("rids", [])) & set(poisoned)
        g.requests |= rids
        g.changed |= rids & changed
        covered |= rids
    return Report(
        sorted(groups.values(), key=lambda g: (g.backend, g.mode)),
        sorted(changed - covered),
        len(poisoned),
    )


# -- the command ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from warcore.cli import Limit

    parser = argparse.ArgumentParser(
        prog="python -m warcore_sglang.audit.sanitize",
        description=(
            "Run sglang's Engine with the given sglang arguments, a two-wave workload plain and "
            "then poisoned at every publish point, and report which declarations published "
            "too early. Example (CPU): python -m warcore_sglang.audit.sanitize "
            "--cpu-tiny-model DIR -- --attention-backend torch_native"
        ),
    )
    parser.add_argument(
        "--requests", type=Limit(int, 1, 1_000), default=6, help="requests per wave (default 6)"
    )
    parser.add_argument(
        "--new-tokens", type=Limit(int, 1, 4_096), default=12, help="tokens per request"
    )
    parser.add_argument(
        "--cpu-tiny-model",
        metavar="DIR",
        help="write the tiny random-weight model to DIR and serve it on this CPU (the CPU "
        "switches and flags of warcore_sglang.serving.harness); without it, pass --model-path ...",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the report to FILE")
    parser.add_argument(
        "--timeout", type=Limit(float, 1.0, 86_400.0), default=600, help="seconds for the run"
    )
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER, help="-- then sglang's arguments")
    return parser


def _run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Serve the two waves, plain then tagged, under the trace and the sanitizer: (the trace's
    records, each request's tokens)."""
    from ..serving import harness as serving
    from ..settings import fast_path_env

    extra = [a for a in args.sglang_args if a != "--"]
    with tempfile.TemporaryDirectory(prefix="warcore-sanitize-") as tmp:
        trace_path = str(Path(tmp) / "trace.jsonl")
        env = {trace.ENV_TRACE: trace_path, ENV_SANITIZE: "tagged"}
        # the prefill fast path on, so that early prefill declarations publish (and are
        # audited), unless the caller's environment says otherwise
        env.update(fast_path_env(os.environ))
        if args.cpu_tiny_model:
            serving.write_tiny_model(args.cpu_tiny_model)
            engine = serving.cpu_engine_args(args.cpu_tiny_model)
            env.update(serving.cpu_env())
        else:
            engine = {}
        engine.update(serving.parse_engine_args(extra))
        waves = serving.two_waves(args.requests, args.new_tokens)
        result = serving.run_engine(
            engine,
            [*waves, *serving.tagged(waves, TAG)],
            env=env,
            timeout=args.timeout,
            workdir=tmp,
        )
        records = trace.read_trace(trace_path)
    return records, result["tokens"]


def _report_doc(report: Report) -> dict[str, object]:
    groups = [
        {
            **g.__dict__,
            "requests": sorted(g.requests),
            "changed": sorted(g.changed),
            "not_covered": sorted(g.not_covered),
            "verdict": g.verdict,
        }
        for g in report.groups
    ]
    return {"ok": report.ok, "groups": groups, "unexplained": report.unexplained}


def main(argv: list[str] | None = None) -> int:
    from warcore.cli import JsonOutput

    from ..serving.harness import missing_for_serving
    from ..settings import PrefillSwitchError, prefill_switch_setting

    parser = _parser()
    args = parser.parse_args(argv)
    output = JsonOutput(parser, args.json)
    missing = missing_for_serving()
    if missing is not None:
        print(f"{parser.prog}: {missing}", file=sys.stderr)
        return 2
    try:
        prefill_switch_setting(os.environ)  # refused here, not in the server it would start
    except PrefillSwitchError as exc:
        parser.error(str(exc))
    records, tokens = _run(args)
    plain = {rid: ids for rid, ids in tokens.items() if not rid.startswith(TAG)}
    poisoned = {rid: ids for rid, ids in tokens.items() if rid.startswith(TAG)}
    report = compare(records, plain, poisoned)
    print("\n".join(report.lines()))
    return output.write(_report_doc(report)) or (0 if report.ok else 1)


if __name__ == "__main__":
    from warcore.cli import run_command

    raise SystemExit(run_command("python -m warcore_sglang.audit.sanitize", main))
