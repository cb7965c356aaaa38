"""warcore-sglang refuses sglang 0.5.22, a release it has not audited, and sglang serves alone.

sglang 0.5.22 is the real wheel from the package index (``nox -s sglang_refusal`` installs it
from ``plugins/sglang/sglang-0.5.22-pins.txt``). Its WAR-barrier code is not 0.5.23's where
warcore-sglang copies sglang: the base backend has ``prepare_prefill_shared_read_snapshot``
(returning ``None``) and no ``resolve_prefill_shared_read_ends`` or
``_snapshot_prefill_shared_reads``, its prefill publisher takes the batch and decides there
(with a draft stager), and its prefill read-done is off by default. So the version gate must
refuse it before anything is patched, and the server must still serve, on sglang's own
decisions.

* On its real classes: ``install()`` raises ``UnsupportedSglangError`` naming 0.5.22 and the
  audited version, and every class and module the activation patches or observes holds exactly
  the objects sglang defined (nothing added, removed or replaced; no import hook left behind).
* In its real ``Engine`` on this CPU (``WARCORE_SGLANG=1``, a trace file): the scheduler
  process printed one start-up line, saying warcore is NOT active because of the version; the
  requests got their tokens; every barrier in the trace is sglang's own (``warcore`` false),
  and sglang 0.5.22's own prefill gate published the backend's early declaration.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from typing import Any

import pytest
import warcore_sglang
from _served import AUDITED, REFUSED, WAVES, Served
from warcore_sglang.activation import UnsupportedSglangError

SRT = "sglang.srt."
MODULES = [
    SRT + m
    for m in (
        # patched by the activation (SGLANG-DRIFT.md 2.1, 2.2)
        "layers.attention.base_attn_backend",
        "speculative.spec_info",
        "speculative.spec_registry",
        "model_executor.runner.decode_cuda_graph_runner",
        "speculative.base_spec_worker",
        "managers.tp_worker",
        "model_executor.model_runner_components.attention_backend_setup",
        "managers.scheduler",
        # observed by the trace and the sanitizer (2.3), and the subclasses the patches reach
        "model_executor.model_runner",
        "model_executor.runner_utils.shared_read_event",
        "speculative.eagle_worker_v2",
        "speculative.multi_layer_eagle_worker_v2",
        # not speculative.uno_worker_v2: 0.5.22's imports flashinfer (uno_tree.py), absent on
        # a CPU (0.5.23's does not)
        "layers.attention.torch_native_backend",
    )
]
POINTS = {
    # (class, attribute) the activation replaces or wraps in 0.5.23: each must be among what
    # the snapshot compares, so that a patch of it could not go unseen
    ("AttentionBackend", "shared_read_ends"),
    ("SpeculativeAlgorithm", "supports_prefill_shared_read_done"),
    ("CustomSpecAlgo", "supports_prefill_shared_read_done"),
    ("DecodeCudaGraphRunner", "_resolve_shared_read_ends"),
    ("BaseSpecWorker", "last_shared_read_runner"),
    ("EAGLEWorkerV2", "last_shared_read_runner"),
    ("BaseTpWorker", "last_shared_read_runner"),
    ("Scheduler", "__init__"),
    ("Scheduler", "_apply_war_barrier"),
    ("ModelRunner", "forward"),
}


def _classes(modules: list[Any]) -> list[type]:
    """The classes the modules define, and every subclass of them (sglang's and others')."""
    found: list[type] = []
    stack = [
        v
        for m in modules
        for v in vars(m).values()
        if isinstance(v, type) and v.__module__ == m.__name__
    ]
    while stack:
        klass = stack.pop()
        if klass not in found:
            found.append(klass)
            stack.extend(type.__subclasses__(klass))
    return found


def _snapshot(modules: list[Any]) -> dict[tuple[str, str], Any]:
    """Every attribute each module and each class holds itself: (owner, name) -> object."""
    out: dict[tuple[str, str], Any] = {}
    for owner in (*modules, *_classes(modules)):
        label = owner.__name__ if owner in modules else f"{owner.__module__}:{owner.__qualname__}"
        out |= {(label, name): value for name, value in vars(owner).items()}
    return out


def test_install_refuses_0_5_22_and_patches_nothing() -> None:
    modules = [importlib.import_module(m) for m in MODULES]
    before = _snapshot(modules)
    held = {(label.rpartition(":")[2], name) for label, name in before}
    assert held >= POINTS, POINTS - held
    hooks = list(sys.meta_path)
    for kwargs in ({}, {"check_ranks": True}):
        with pytest.raises(UnsupportedSglangError) as refused:
            warcore_sglang.install(**kwargs)
        message = str(refused.value)
        assert re.search(rf"\bsglang {re.escape(REFUSED)}\b", message), message
        assert AUDITED in message, message
        assert not warcore_sglang.is_installed()
    warcore_sglang.uninstall()  # nothing to undo
    after = _snapshot(modules)
    assert sys.meta_path == hooks
    assert set(after) == set(before), set(after) ^ set(before)
    changed = sorted(k for k in before if after[k] is not before[k])
    assert not changed, changed


def test_past_the_version_the_shape_gate_refuses_0_5_22_by_its_first_differing_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An sglang 0.5.22 claiming to be an audited version (its version gate passed, 0.5.23's
    table applied): the shape gate still refuses it, naming the first check that differs, and
    nothing stays patched."""
    from warcore_sglang import _names

    modules = [importlib.import_module(m) for m in MODULES]
    before = _snapshot(modules)
    monkeypatch.setitem(_names.AUDITED, REFUSED, _names.AUDITED[AUDITED])
    with pytest.raises(UnsupportedSglangError) as refused:
        warcore_sglang.install()
    message = str(refused.value)
    assert f"differs from the audited {REFUSED} at " in message, message
    assert "module global envs: missing" in message, message  # base_attn_backend, first
    assert "sglang's own barrier decisions apply" in message
    assert not warcore_sglang.is_installed()
    after = _snapshot(modules)
    assert not sorted(k for k in before if after.get(k) is not before[k])


def test_0_5_22_differs_where_warcore_sglang_copies_sglang() -> None:
    """What the refusal protects against, on the installed wheel (the shape gate's evidence)."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention import base_attn_backend as base
    from sglang.srt.model_executor.runner_utils import shared_read_event

    backend = vars(base.AttentionBackend)
    assert "resolve_prefill_shared_read_ends" not in backend
    assert "_snapshot_prefill_shared_reads" not in backend
    assert "prepare_prefill_shared_read_snapshot" in backend
    assert not hasattr(base, "envs") and not hasattr(base, "ForwardMode")
    publish = shared_read_event.maybe_publish_prefill_shared_read_done
    params = list(inspect.signature(publish).parameters)
    assert params == ["model_runner", "forward_batch", "device_module"], params
    assert envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.default is False
    # the members warcore maps by name are 0.5.23's
    assert {e.name: e.value for e in base.SharedReadEnds} == {
        "PRE_REPLAY": 1,
        "IN_REPLAY": 2,
        "POST_REPLAY": 3,
        "UNKNOWN": 4,
    }


def test_the_scheduler_says_not_active_once_and_the_server_serves_on_its_own(
    served: Served,
) -> None:
    log = served.log_text()
    processes = {p["role"]: p for p in served.kind("process")}
    assert set(processes) == {"engine", "scheduler", "detokenizer"}, served.kind("process")
    for p in processes.values():
        # one start-up line per process, in the log as in the trace
        lines = [ln for ln in log.splitlines() if f"warcore-sglang: process {p['pid']} (" in ln]
        assert len(lines) == 1 and p["line"] in lines[0], (p, lines)
        assert p["active"] is False, p
    scheduler = processes["scheduler"]
    assert scheduler["left_to_schedulers"] is False, scheduler
    assert "warcore NOT active: UnsupportedSglangError" in scheduler["line"], scheduler["line"]
    assert re.search(rf"\bsglang {re.escape(REFUSED)}\b", scheduler["reason"]), scheduler
    assert AUDITED in scheduler["reason"], scheduler
    assert "warcore active" not in log
    # it served: every request got the tokens it asked for
    asked = {r.rid: r.max_new_tokens for wave in WAVES for r in wave}
    assert {rid: len(ids) for rid, ids in served.tokens.items()} == asked
    # on sglang's own decisions: every barrier in the scheduler, none answered by warcore; the
    # backend's PRE_REPLAY prefill published by 0.5.22's own gate (from its eager runner) and
    # waited on as an event, its eager decode publishing nothing (the whole-forward wait)
    barriers = served.kind("barrier")
    assert barriers and {b["pid"] for b in barriers} == {scheduler["pid"]}
    assert not any(b["warcore"] for b in barriers)
    ours = set(asked)
    prefills = [b for b in barriers if b["mode"] == "EXTEND" and set(b["rids"]) & ours]
    decodes = [b for b in barriers if b["mode"] == "DECODE"]
    assert len(prefills) == len(WAVES) and decodes, barriers
    assert {(b["branch"], b["event"]) for b in prefills} == {("wait_event", True)}, prefills
    assert {b["publisher"] for b in prefills} == {"EagerRunner._execute_extend"}, prefills
    assert {b["branch"] for b in decodes} == {"wait_stream"}, decodes
