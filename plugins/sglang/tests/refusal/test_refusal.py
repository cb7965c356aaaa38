"""warcore-sglang refuses sglang 0.5.20, a release it has not audited, and sglang serves alone.

sglang 0.5.20 is the real wheel from the package index (``nox -s sglang_refusal`` installs it
from ``plugins/sglang/sglang-0.5.20-pins.txt``). Its WAR-barrier code is not any audited
release's: its algorithms have no ``supports_prefill_shared_read_done`` (its prefill publisher
asks ``is_none() or is_dflash_family()`` itself), and its publisher, its EAGLE owner and its
runners' bodies differ from 0.5.21's. So the version gate must refuse it before anything is
patched, and the server must still serve, on sglang's own decisions.

* On its real classes: ``install()`` raises ``UnsupportedSglangError`` naming 0.5.20 and the
  audited releases, and every class and module the activation patches or observes holds exactly
  the objects sglang defined (nothing added, removed or replaced; no import hook left behind).
  Past the version (0.5.20 taken for 0.5.21), the shape gate refuses it at its first check.
* In its real ``Engine`` on this CPU (``WARCORE_SGLANG=1``, a trace file): the scheduler
  process printed one start-up line, saying warcore is NOT active because of the release; the
  requests got their tokens; every barrier in the trace is sglang's own (``warcore`` false).
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
        # not speculative.uno_worker_v2: it imports flashinfer (uno_tree.py), absent on a CPU
        "layers.attention.torch_native_backend",
    )
]
POINTS = {
    # (class, attribute) the activation replaces or wraps in the audited releases and 0.5.20
    # has: each must be among what the snapshot compares, so that a patch of it could not go
    # unseen (0.5.20's algorithms have no supports_prefill_shared_read_done)
    ("AttentionBackend", "shared_read_ends"),
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


def test_install_refuses_0_5_20_and_patches_nothing() -> None:
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
        warcore_sglang.uninstall()  # the rank check's join, where it was asked for
    after = _snapshot(modules)
    assert sys.meta_path == hooks
    assert set(after) == set(before), set(after) ^ set(before)
    changed = sorted(k for k in before if after[k] is not before[k])
    assert not changed, changed


def test_a_refused_rank_still_joins_the_rank_check_saying_its_release() -> None:
    """With the rank check asked for, a rank whose release is refused patches nothing of
    sglang's decisions but still ends its ``Scheduler.__init__`` with the check, its fact
    naming its release: the other ranks refuse naming both releases, instead of waiting for
    this one until the check times out (``uninstall()`` puts ``__init__`` back)."""
    from sglang.srt.managers.scheduler import Scheduler
    from warcore_sglang.activation import _ranks

    init = vars(Scheduler)["__init__"]
    with pytest.raises(UnsupportedSglangError):
        warcore_sglang.install(check_ranks=True)
    try:
        assert not warcore_sglang.is_installed()
        assert vars(Scheduler)["__init__"].__warcore_original__ is init
        assert _ranks._fact() == f"refused: sglang {REFUSED} is not an audited release"
        assert _ranks._mode() == "raise"
    finally:
        warcore_sglang.uninstall()
    assert vars(Scheduler)["__init__"] is init


def test_past_the_version_the_shape_gate_refuses_0_5_20_by_its_first_differing_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An sglang 0.5.20 claiming to be an audited release (its version gate passed, the oldest
    audited entry applied): the shape gate still refuses it, naming the first check that
    differs, and nothing stays patched."""
    from warcore_sglang.releases import RELEASES

    modules = [importlib.import_module(m) for m in MODULES]
    before = _snapshot(modules)
    monkeypatch.setitem(RELEASES, REFUSED, next(iter(RELEASES.values())).derive(REFUSED))
    with pytest.raises(UnsupportedSglangError) as refused:
        warcore_sglang.install()
    message = str(refused.value)
    assert f"differs from the audited {REFUSED} at " in message, message
    # speculative.spec_info, the first watched module with a difference
    assert "at SpeculativeAlgorithm.supports_prefill_shared_read_done: not defined" in message
    assert "sglang's own barrier decisions apply" in message
    assert not warcore_sglang.is_installed()
    after = _snapshot(modules)
    assert not sorted(k for k in before if after.get(k) is not before[k])


def test_0_5_20_differs_where_warcore_sglang_relies_on_sglang() -> None:
    """What the refusal protects against, on the installed wheel (the shape gate's evidence)."""
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention import base_attn_backend as base
    from sglang.srt.model_executor.runner_utils import shared_read_event
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert "supports_prefill_shared_read_done" not in vars(SpeculativeAlgorithm)
    assert "resolve_prefill_shared_read_ends" not in vars(base.AttentionBackend)
    publish = shared_read_event.maybe_publish_prefill_shared_read_done
    params = list(inspect.signature(publish).parameters)
    assert params == ["model_runner", "forward_batch", "device_module"], params
    assert "is_dflash_family" in inspect.getsource(publish)  # its own algorithm gate
    assert envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.default is False
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
    # 0.5.20, like 0.5.21, loads plugins in the engine's and the scheduler's processes only
    assert set(processes) == {"engine", "scheduler"}, served.kind("process")
    for p in processes.values():
        # one start-up line per process, in the log as in the trace
        lines = [ln for ln in log.splitlines() if f"warcore-sglang: process {p['pid']} (" in ln]
        assert len(lines) == 1 and p["line"] in lines[0], (p, lines)
        assert p["active"] is False, p
    scheduler = processes["scheduler"]
    assert scheduler["left_to_schedulers"] is False, scheduler
    assert "warcore NOT active: UnsupportedSglangError" in scheduler["line"], scheduler["line"]
    assert re.search(rf"\bsglang {re.escape(REFUSED)}\b", scheduler["reason"]), scheduler
    assert f"audited: {AUDITED}, exactly" in scheduler["reason"], scheduler
    assert "warcore active" not in log
    # it served: every request got the tokens it asked for
    asked = {r.rid: r.max_new_tokens for wave in WAVES for r in wave}
    assert {rid: len(ids) for rid, ids in served.tokens.items()} == asked
    # on sglang's own decisions: every barrier in the scheduler, none answered by warcore;
    # torch_native declares nothing early, so each is sglang's whole-forward wait
    barriers = served.kind("barrier")
    assert barriers and {b["pid"] for b in barriers} == {scheduler["pid"]}
    assert not any(b["warcore"] for b in barriers)
    modes = {b["mode"] for b in barriers}
    assert {"EXTEND", "DECODE"} <= modes, barriers
    assert {b["branch"] for b in barriers} == {"wait_stream"}, barriers
