"""The per-barrier trace of a running sglang server, and its summary.

``WARCORE_SGLANG_TRACE=FILE`` makes every sglang process that loads warcore-sglang's
``sglang.srt.plugins`` entry point (every server process, warcore active or not) append JSON
lines to FILE, one write per line (``O_APPEND``: processes share the file):

* ``process``: at start-up, the process (pid, parent, role) and whether warcore is active,
  with which plugins, or why not: the same facts as its start-up log line;
* ``publish``: each read-done event a model runner publishes: the forward mode, the record
  point (``pre_replay``, ``in_replay``, ``post_replay``, read off the publishing runner), the
  runner code that published, the backend, its declaration and the declaration's provenance,
  the batch's request ids;
* ``barrier``: each call of the real ``Scheduler._apply_war_barrier``: process and rank, the
  batch's forward mode, the event owner (``target``, ``draft``, or ``none`` when warcore names
  no owner), whether an event was published and where, the branch the barrier took as observed
  on the schedule stream (``wait_event``: fine, ``wait_stream``: coarse, ``disabled``), and the
  decision's provenance (``plugin:<name>``, ``default:failed:<name>``, ``forced-coarse``,
  ``veto:...``, or ``sglang:...`` where sglang decided alone);
* ``poison`` (with ``WARCORE_SGLANG_SANITIZE``): each publish the sanitizer poisoned
  (:mod:`warcore_sglang.audit.sanitize`).

``python -m warcore_sglang.audit.trace FILE...`` summarises a trace like ``warcore run``'s report:
forward mode x record point x branch x provenance, with counts, and the fine and coarse
barriers per scheduler; and compares the ranks batch by batch
(:mod:`warcore_sglang.audit.trace_ranks`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import observe as _observe

__all__ = [
    "ENV_TRACE",
    "Summary",
    "TraceError",
    "check_record",
    "Tracer",
    "format_summary",
    "install",
    "main",
    "read_trace",
    "summarise",
    "uninstall",
    "write_record",
]

ENV_TRACE = "WARCORE_SGLANG_TRACE"
"""``FILE``: every sglang process with warcore-sglang's entry point appends its trace there."""

FINE, COARSE, OFF = "wait_event", "wait_stream", "disabled"
UNOBSERVED = "unobserved"
"""The barrier was on but told the schedule stream nothing (it waited some other way)."""


def write_record(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one JSON line (one ``write``, so lines of several processes never interleave)."""
    line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a trace file, in the order written (a torn last line is skipped).
    Raises :class:`TraceError` naming the file and the first line that is not a record of the
    shape a trace holds (:func:`check_record`)."""
    path = os.fspath(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a trace: byte {exc.start} is not UTF-8 text") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        torn = number == len(lines)  # the last line, unterminated: a writer was stopped
        try:
            record = json.loads(line)
        except ValueError as exc:  # JSONDecodeError, and an integer of too many digits
            if torn:
                continue
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise TraceError(f"{path}: line {number}: not JSON ({why})") from None
        except RecursionError:
            raise TraceError(f"{path}: line {number}: JSON nested too deeply") from None
        problem = check_record(record)
        if problem is not None:
            raise TraceError(f"{path}: line {number}: {problem}")
        records.append(record)
    return records


class TraceError(ValueError):
    """A trace file that cannot be read, or a line in it that is not a trace record."""


_FIELDS: dict[str, tuple[tuple[str, type | tuple[type, ...]], ...]] = {
    "process": (("pid", int), ("role", str), ("active", bool)),
    "publish": (("pid", int), ("mode", str), ("record_point", str), ("provenance", str)),
    "barrier": (
        ("pid", int),
        ("mode", str),
        ("record_point", str),
        ("branch", str),
        ("owner", str),
        ("provenance", str),
    ),
    "poison": (
        ("pid", int),
        ("mode", str),
        ("record_point", str),
        ("backend", str),
        ("provenance", str),
    ),
}
"""Each record kind a summary reads -> the fields it reads and their types (other kinds, and
other fields, are kept and not checked: a newer writer may add them)."""


def check_record(record: Any) -> str | None:
    """Why ``record`` is not a trace record (``None``: it is)."""
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        return f"not a trace record (a JSON object with a 'kind'), got {type(record).__name__}"
    for name, kind in _FIELDS.get(record["kind"], ()):
        if name not in record:
            return f"a {record['kind']} record without {name!r}"
        value = record[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"a {record['kind']} record whose {name!r} is {_shown(value)}"
    for name, ok in _SHAPES.items():
        value = record.get(name)
        if value is not None and not ok(value):
            return f"a {record['kind']} record whose {name!r} is {_shown(value)}"
    return None


def _is_rank(value: Any) -> bool:
    return isinstance(value, dict) and all(
        v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value.values()
    )


_SHAPES: dict[str, Callable[[Any], bool]] = {
    "rank": _is_rank,  # {"tp": 0, "pp": 0, "dp": None}
    "rids": lambda v: isinstance(v, list) and all(isinstance(r, (str, int)) for r in v),
    "plugins": lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v),
}
"""Optional fields a summary or the rank comparison reads -> the shape they must have."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:80]}..."


# -- what the decision was, and why --------------------------------------------------------


def _activation() -> Any:
    module = sys.modules.get("warcore_sglang.activation")
    return module if module is not None and module.is_installed() else None


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", mode))


def backend_name(backend: Any) -> str:
    """The backend's warcore name where warcore-sglang can name it, else its class."""
    activation = _activation()
    if activation is not None:
        try:
            name = activation.identify(backend)[0]
        except Exception:
            name = None
        if name is not None:
            return str(name)
    return type(backend).__qualname__


def _sglang_alone(model_runner: Any, backend: Any, mode: Any) -> tuple[str, str]:
    """The installed sglang's own decision for (backend, mode), as its code makes it: a prefill
    decided by 0.5.23's resolver (force-coarse, its opt-in, the declaration, the algorithm) or
    by 0.5.21's and 0.5.22's publisher (its opt-in, the declaration, the algorithm)."""
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from ..declarations.oracle import release
    from ..settings import DEFAULT, read_prefill_switch

    cls = type(backend).__qualname__
    declared = type(backend).shared_read_ends(backend, mode)
    if mode != ForwardMode.EXTEND:
        return declared.name, f"sglang:{cls}.shared_read_ends"
    found = release()
    resolver = found is None or found.prefill == "resolver"  # the publisher does not read it
    if resolver and envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get():
        return "UNKNOWN", "sglang:SGLANG_FORCE_COARSE_WAR_BARRIER"
    # Not activated: sglang's own code decides, and reads its own switch whatever
    # WARCORE_SGLANG_PREFILL_SWITCH says.
    switch = read_prefill_switch(DEFAULT, os.environ, envs)
    if not switch.on:
        return "UNKNOWN", switch.source
    if declared.name == "PRE_REPLAY":
        algo = getattr(model_runner, "spec_algorithm", None)
        if algo is not None and not algo.supports_prefill_shared_read_done():
            return "UNKNOWN", f"sglang:{algo}.supports_prefill_shared_read_done() is False"
    return declared.name, f"sglang:{cls}.shared_read_ends"


def explain(model_runner: Any, mode: Any) -> tuple[str, str]:
    """(declared boundary, provenance) of ``model_runner``'s backend for sglang mode ``mode``
    in this process: warcore's answer where the activation is installed, else sglang's."""
    backend = getattr(model_runner, "attn_backend", None)
    if backend is None:
        return "UNKNOWN", "sglang:no attention backend"
    try:
        activation = _activation()
        if activation is None:
            return _sglang_alone(model_runner, backend, mode)
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if mode == ForwardMode.EXTEND:
            boundary, why = activation.explain_prefill(backend)
        else:
            boundary, why = activation.explain(backend, mode)
        return boundary.name, why
    except Exception as exc:  # the trace never takes the scheduler down
        return "UNKNOWN", f"trace: explaining failed ({type(exc).__name__}: {exc})"


def _eager_silence(model_runner: Any, mode: Any) -> str | None:
    """Why a forward that is not a prefill published nothing whatever is declared: sglang
    publishes only from its decode CUDA-graph runner and the EAGLE draft-extend runner; an
    eager forward (and the CPU graph runner) publishes nothing."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if mode == ForwardMode.EXTEND:
        return None
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    if runner is None or type(runner).__name__ != "DecodeCudaGraphRunner":
        kind = "eager" if runner is None else type(runner).__name__
        return f"sglang: an {kind} {_mode_name(mode)} forward publishes nothing"
    return None


# -- the listener ---------------------------------------------------------------------------


def _rank(scheduler: Any) -> dict[str, Any]:
    """The scheduler's ranks (sglang keeps them in its runtime context)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return {k: getattr(parallel, f"{k}_rank", None) for k in ("tp", "pp", "dp")}
    except Exception:
        return {k: getattr(scheduler, f"{k}_rank", None) for k in ("tp", "pp", "dp")}


def _owner(owner: Any) -> str:
    if owner is None:
        return "none"
    if not hasattr(owner, "forward"):  # the activation's no-event runner: nobody owns it
        return "none"
    return "draft" if getattr(owner, "is_draft_worker", False) else "target"


def _rids(batch: Any) -> list[str]:
    reqs = getattr(batch, "reqs", None) or []
    return [str(getattr(r, "rid", "?")) for r in reqs]


class Tracer(_observe.Listener):
    """Writes ``publish`` and ``barrier`` records to ``path``."""

    name = "trace"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._published: dict[int, tuple[Any, dict[str, Any]]] = {}
        """model runner (id) -> (its latest published event, that publish's record): one entry
        per runner, however many events are published that no barrier takes."""
        self._steps = 0
        self._lock = threading.Lock()
        self._decode_side: bool | None = None
        """This process is a PD decode side (its forwards' slots are kept for transfers)."""
        self._forwards = 0
        self._forward_slots: set[int] = set()
        """The KV slots the last forward read or wrote (a PD decode side only)."""

    def on_publish(self, publish: _observe.Publish) -> None:
        forward = _observe.current_forward(publish.model_runner)
        mode = getattr(forward, "forward_mode", None)
        declared, why = explain(publish.model_runner, mode) if mode is not None else ("?", "?")
        record = {
            "kind": "publish",
            "pid": os.getpid(),
            "t": time.time(),
            "mode": _mode_name(mode),
            "record_point": publish.record_point,
            "publisher": publish.publisher,
            "runner": "draft"
            if getattr(publish.model_runner, "is_draft_worker", False)
            else "target",
            "backend": backend_name(getattr(publish.model_runner, "attn_backend", None)),
            "declared": declared,
            "provenance": why,
            "rids": _rids(_observe.current_batch()),
        }
        with self._lock:
            self._published[id(publish.model_runner)] = (publish.event, record)
        write_record(self.path, record)

    def on_forward_end(self, model_runner: Any, forward_batch: Any) -> None:
        if self._decode_side is None:
            args = getattr(model_runner, "server_args", None)
            mode = getattr(args, "disaggregation_mode", None)
            self._decode_side = str(getattr(mode, "value", mode)) == "decode"
        if self._decode_side:
            with self._lock:
                self._forwards += 1
            self._forward_slots = _slots_read(model_runner, forward_batch)

    def on_transfer(self, transfer: Any) -> None:
        """A ``transfer`` record: the KV slots a decode side hands to the transfer engine,
        how many of them the last forward read or wrote (``shared``), whether that forward was
        still in flight, and whether warcore waited for it first (``ordered``)."""
        handed = {int(s) for s in transfer.slots.tolist()}
        record = {
            "kind": "transfer",
            "pid": os.getpid(),
            "t": time.time(),
            "rank": _rank(transfer.scheduler),
            "rid": transfer.rid,
            "slots": len(handed),
            "after_forward": self._forwards,
            "shared": len(handed & self._forward_slots),
            "in_flight": transfer.in_flight,
            "ordered": "warcore: forward stream synchronized" if transfer.waited else "none",
        }
        write_record(self.path, record)

    def on_barrier(self, barrier: _observe.Barrier) -> None:
        scheduler = barrier.scheduler
        batch = getattr(scheduler, "cur_batch_for_debug", None)
        mode = getattr(batch, "forward_mode", None)
        with self._lock:
            self._steps += 1
            step = self._steps
            latest = self._published.get(id(barrier.owner))
            published = latest if latest is not None and latest[0] is barrier.event else None
        branches = [kind for kind, _ in barrier.waits]
        branch = "+".join(branches) if branches else UNOBSERVED if barrier.enabled else OFF
        runner = barrier.owner if _owner(barrier.owner) != "none" else None
        if published is not None:
            info = published[1]
            point, publisher = info["record_point"], info["publisher"]
            declared, why, backend = info["declared"], info["provenance"], info["backend"]
        else:
            point, publisher = "none", None
            target = runner if runner is not None else _target_runner(scheduler)
            declared, why = explain(target, mode) if target is not None else ("?", "?")
            backend = backend_name(getattr(target, "attn_backend", None))
            if target is not None and runner is not None:
                why = _eager_silence(target, mode) or why
            elif runner is None and barrier.owner is not None:
                why = "warcore: no event owner for this step"
        record = {
            "kind": "barrier",
            "pid": os.getpid(),
            "t": time.time(),
            "rank": _rank(scheduler),
            "step": step,
            "mode": _mode_name(mode),
            "batch_size": len(getattr(batch, "reqs", None) or []),
            "owner": _owner(barrier.owner),
            "event": barrier.event is not None,
            "record_point": point,
            "publisher": publisher,
            "branch": branch,
            "backend": backend,
            "declared": declared,
            "provenance": why,
            "warcore": _activation() is not None,
            "loop": barrier.loop,
        }
        if mode is not None and _mode_name(mode) == "EXTEND":  # which rows the prefill took
            reqs = getattr(batch, "reqs", None) or []
            record["rids"] = [str(getattr(r, "rid", "?")) for r in reqs]
            record["rows"] = [getattr(getattr(r, "kv", r), "req_pool_idx", None) for r in reqs]
        write_record(self.path, record)


def _slots_read(model_runner: Any, forward_batch: Any) -> set[int]:
    """The KV slots a forward touched: its requests' ``req_to_token`` rows up to their lengths
    (read by attention) and ``out_cache_loc`` (written)."""
    rows = model_runner.req_to_token_pool.req_to_token
    slots = {int(s) for s in forward_batch.out_cache_loc.tolist()}
    for row, length in zip(
        forward_batch.req_pool_indices.tolist(), forward_batch.seq_lens.tolist(), strict=True
    ):
        slots.update(int(s) for s in rows[row, :length].tolist())
    return slots


def _target_runner(scheduler: Any) -> Any:
    worker = getattr(scheduler, "model_worker", None)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        target = getattr(worker, "target_worker", None)
        runner = getattr(target, "model_runner", None)
    return runner


def install(path: str | os.PathLike[str]) -> Tracer:
    """Trace this process into ``path`` (idempotent: a second call returns the first tracer)."""
    return _observe.attach(Tracer(path))


def uninstall() -> None:
    _observe.detach(Tracer.name)


# -- the summary ----------------------------------------------------------------------------


@dataclass
class SchedulerSummary:
    pid: int
    rank: dict[str, Any]
    file: str = ""
    """The trace file it is in, where several are summarised (pids repeat across nodes)."""
    barriers: int = 0
    rows: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    """(forward mode, record point, branch, provenance) -> barriers."""
    branches: Counter[str] = field(default_factory=Counter)
    owners: Counter[str] = field(default_factory=Counter)
    poisoned: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    """(forward mode, record point, backend, provenance) -> poisoned publishes."""


@dataclass
class Summary:
    path: str
    processes: list[dict[str, Any]]
    schedulers: list[SchedulerSummary]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "processes": self.processes,
            "schedulers": [
                {
                    "pid": s.pid,
                    "rank": s.rank,
                    "barriers": s.barriers,
                    "fine": s.branches[FINE],
                    "coarse": s.branches[COARSE],
                    "disabled": s.branches[OFF],
                    "owners": dict(s.owners),
                    "rows": [
                        {
                            "mode": m,
                            "record_point": p,
                            "branch": b,
                            "provenance": why,
                            "barriers": n,
                        }
                        for (m, p, b, why), n in sorted(s.rows.items())
                    ],
                    "poisoned": [
                        {"mode": m, "record_point": p, "backend": be, "provenance": why, "n": n}
                        for (m, p, be, why), n in sorted(s.poisoned.items())
                    ],
                }
                for s in self.schedulers
            ],
        }


def summarise_files(traces: list[list[dict[str, Any]]], paths: list[str]) -> Summary:
    """One summary of several trace files (one per node): a scheduler is known by its file
    and pid, as :func:`~warcore_sglang.audit.trace_ranks.compare_ranks` knows it."""
    summaries = [summarise(records, path) for records, path in zip(traces, paths, strict=True)]
    if len(summaries) > 1:
        for summary in summaries:
            for s in summary.schedulers:
                s.file = summary.path
    return Summary(
        ", ".join(paths),
        [p for summary in summaries for p in summary.processes],
        [s for summary in summaries for s in summary.schedulers],
    )


def summarise(records: list[dict[str, Any]], path: str = "") -> Summary:
    processes = [r for r in records if r.get("kind") == "process"]
    per: dict[int, SchedulerSummary] = {}
    for r in records:
        kind = r.get("kind")
        if kind not in ("barrier", "poison"):
            continue
        pid = int(r.get("pid", 0))
        s = per.setdefault(pid, SchedulerSummary(pid, r.get("rank") or {}))
        if kind == "barrier":
            if r.get("rank"):
                s.rank = r["rank"]
            s.barriers += 1
            s.rows[(r["mode"], r["record_point"], r["branch"], r["provenance"])] += 1
            s.branches[r["branch"]] += 1
            s.owners[r["owner"]] += 1
        else:
            s.poisoned[(r["mode"], r["record_point"], r["backend"], r["provenance"])] += 1
    return Summary(path, processes, [per[p] for p in sorted(per)])


def _process_line(p: dict[str, Any]) -> str:
    if p.get("active"):
        names = [x["name"] for x in p.get("plugins", []) if x.get("status") == "active"]
        status = f"warcore active; plugins: {', '.join(names) or 'none'}"
    elif p.get("left_to_schedulers"):
        status = "warcore left to the scheduler processes (builds no model runner)"
    else:
        status = f"warcore NOT active: {p.get('reason')}"
    if p.get("sanitize"):
        status += f"; sanitizer {p['sanitize']}"
    return f"    pid {p.get('pid')}  {p.get('role', '?'):<12} {status}"


def format_summary(summary: Summary) -> str:
    lines = [
        f"warcore-sglang trace {summary.path}: {len(summary.processes)} processes, "
        f"{len(summary.schedulers)} scheduler(s) with barriers"
    ]
    if summary.processes:
        lines.append("  processes")
        lines += [_process_line(p) for p in summary.processes]
    for s in summary.schedulers:
        rank = ", ".join(f"{k} {v}" for k, v in s.rank.items() if v is not None)
        where = f" in {s.file}" if s.file else ""
        lines.append(f"  scheduler pid {s.pid}{where} ({rank or 'rank ?'}): {s.barriers} barriers")
        if s.rows:
            lines.append(
                "    read-done records (forward mode, record point, barrier, provenance: barriers)"
            )
            width = max(len(why) for (_, _, _, why) in s.rows)
            for (mode, point, branch, why), n in sorted(s.rows.items()):
                lines.append(f"      {mode:<15} {point:<12} {branch:<12} {why:<{width}}  {n}")
        owners = ", ".join(f"{k} {v}" for k, v in sorted(s.owners.items()))
        lines.append(
            f"    barriers        coarse {s.branches[COARSE]}, fine {s.branches[FINE]}"
            + (f", disabled {s.branches[OFF]}" if s.branches[OFF] else "")
            + f" (event owner: {owners})"
        )
        if s.poisoned:
            lines.append(
                "    sanitizer: poisoned publishes "
                "(forward mode, record point, backend, provenance)"
            )
            for (mode, point, backend, why), n in sorted(s.poisoned.items()):
                lines.append(f"      {mode:<15} {point:<12} {backend}  {why}  {n}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warcore_sglang.audit.trace",
        description="Summarise a warcore-sglang trace (written with WARCORE_SGLANG_TRACE=FILE) "
        "and compare its ranks batch by batch: the ranks of one pipeline stage and data "
        "parallel group must take the same record point and barrier on every batch. Give one "
        "file every rank wrote, or one per node. Exit 0: the ranks agree; 1: a batch was "
        "decided differently; 2: a file is not a trace.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="trace file(s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    for path in map(Path, args.files):
        if not path.is_file():
            parser.error(f"{path}: no such trace file")
    from .trace_ranks import TwoRuns, compare_ranks

    try:
        traces = [read_trace(path) for path in args.files]
        ranks = compare_ranks(traces, args.files)
    except (TraceError, TwoRuns) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    summary = summarise_files(traces, args.files)
    if args.json:
        doc = summary.as_dict()
        doc["ranks"] = {
            "agree": ranks.agree,
            "groups": [g.__dict__ | {"modes": dict(g.modes)} for g in ranks.groups],
            "divergences": [d.__dict__ for d in ranks.divergences],
        }
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_summary(summary))
        print("  ranks compared batch by batch")
        print("\n".join(ranks.lines()))
    return 0 if ranks.agree else 1


if __name__ == "__main__":
    from warcore.cli import run_command

    raise SystemExit(run_command("python -m warcore_sglang.audit.trace", main))
