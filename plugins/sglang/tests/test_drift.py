"""sglang changed in place into the shapes it is moving to after 0.5.23 (SGLANG-DRIFT.md §3).

Each test changes sglang 0.5.23's real classes the way a later sglang changes them (a PR
branch's shape, with its number), restored after the test, then shows two things:

* the shape gate trips on it, naming its check: ``install()`` refuses, or the activation takes
  itself off, and nothing stays patched;
* with the gate out of the way (an sglang whose drift the gate cannot see), the patched point
  is bounded: it raises nothing into sglang's call and answers no earlier than sglang's own
  code answers the same call (:func:`_never_earlier`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import warcore_sglang
from _real import A, algorithm, bare, cls, leaf
from _release import RELEASE, VERSION, open_gate, replace_release, resolver_only
from warcore_sglang.activation import UnsupportedSglangError, checkpoint
from warcore_sglang.audit import sanitize, trace
from warcore_sglang.declarations import oracle
from warcore_sglang.settings import OPT_IN, OPT_OUT

B = A + "base_attn_backend."


def _sgl() -> SimpleNamespace:
    from sglang.srt.layers.attention import base_attn_backend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        base=base_attn_backend, ends=base_attn_backend.SharedReadEnds, mode=ForwardMode
    )


def _refused(check: str) -> None:
    """``install()`` refuses this sglang, naming ``check``, and patches nothing."""
    base = cls(B + "AttentionBackend")
    before = dict(vars(base))
    with pytest.raises(UnsupportedSglangError) as info:
        warcore_sglang.install()
    message = str(info.value)
    assert check in message, message
    assert f"differs from the audited {VERSION}" in message and "sglang's own barrier" in message
    assert not warcore_sglang.is_installed()
    assert dict(vars(base)) == before


@pytest.fixture(autouse=True)
def _forget_after(monkeypatch: pytest.MonkeyPatch, pm: Any) -> Iterator[None]:
    """sglang is put back after each test, and what warcore cached of it is forgotten."""
    yield
    warcore_sglang.uninstall()
    monkeypatch.undo()
    _forget(pm)


def _forget(pm: Any) -> None:
    pm.register(object(), "wctest_forget")  # a plugin set change: every cached answer goes
    pm.unregister(name="wctest_forget")


def _open_gate(monkeypatch: pytest.MonkeyPatch, pm: Any) -> None:
    """An sglang whose drift the gate does not see: every check passes whatever the code. The
    answers warcore cached of the code as it was are forgotten (a plugin set change)."""
    open_gate(monkeypatch)
    _forget(pm)


def _never_earlier(ask: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``ask(...)`` with warcore installed (it must not raise), against the same call with
    sglang alone: the installed answer is never earlier (its value never smaller)."""
    assert warcore_sglang.is_installed()
    ours = ask(*args, **kwargs)
    warcore_sglang.uninstall()
    try:
        own = ask(*args, **kwargs)
    finally:
        warcore_sglang.install()
    assert ours.value >= own.value, (ours, own)
    return ours, own


# -- #37958: the resolver takes the algorithm; main's opt-out replaces 0.5.23's opt-in ------


def _main_resolver(original: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_prefill_shared_read_ends(
        self: Any,
        forward_batch: Any,
        *,
        num_qo_tokens: int,
        build_snapshot: bool = True,
        spec_algorithm: Any = None,
    ) -> Any:
        # #37958's branch: the algorithm's gate moved into the resolver
        if spec_algorithm is not None and not spec_algorithm.supports_prefill_shared_read_done():
            return _sgl().ends.UNKNOWN
        return original(
            self, forward_batch, num_qo_tokens=num_qo_tokens, build_snapshot=build_snapshot
        )

    return resolve_prefill_shared_read_ends


@resolver_only
def test_a_resolver_with_a_new_keyword_is_refused_or_bounded(
    monkeypatch: pytest.MonkeyPatch, pm: Any
) -> None:
    sgl = _sgl()
    base = sgl.base.AttentionBackend
    original = vars(base)["resolve_prefill_shared_read_ends"]
    monkeypatch.setattr(base, "resolve_prefill_shared_read_ends", _main_resolver(original))
    _refused("signature of AttentionBackend.resolve_prefill_shared_read_ends")

    _open_gate(monkeypatch, pm)
    warcore_sglang.install()
    try:
        fb = SimpleNamespace(forward_mode=sgl.mode.EXTEND)
        for name in ("none", "sglang_eagle", "sglang_dflash"):
            trt = leaf("trtllm_mha", algorithm(name))
            for snapshot in (True, False):
                ours, own = _never_earlier(
                    trt.resolve_prefill_shared_read_ends,
                    fb,
                    num_qo_tokens=8,
                    build_snapshot=snapshot,
                    spec_algorithm=algorithm(name),
                )
                assert (ours is sgl.ends.UNKNOWN) is (name == "sglang_eagle"), (name, ours)
    finally:
        warcore_sglang.uninstall()


def _opt_out_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.environ import EnvBool, Envs

    field = EnvBool(False)
    field.name = OPT_OUT
    monkeypatch.delattr(Envs, OPT_IN)
    monkeypatch.setattr(Envs, OPT_OUT, field, raising=False)


def _opt_out_resolver(
    self: Any, forward_batch: Any, *, num_qo_tokens: int, build_snapshot: bool = True
) -> Any:
    sgl = _sgl()
    envs = sgl.base.envs
    if envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get() or getattr(envs, OPT_OUT).get():
        return sgl.ends.UNKNOWN
    if forward_batch.forward_mode != sgl.mode.EXTEND:
        return sgl.ends.UNKNOWN
    if build_snapshot:
        return self._snapshot_prefill_shared_reads(forward_batch, num_qo_tokens=num_qo_tokens)
    return self.shared_read_ends(forward_batch.forward_mode)


@resolver_only
def test_the_opt_in_removed_and_the_opt_out_added_is_refused_or_bounded(
    monkeypatch: pytest.MonkeyPatch, pm: Any
) -> None:
    sgl = _sgl()
    monkeypatch.delenv(OPT_OUT, raising=False)
    _opt_out_field(monkeypatch)
    base = sgl.base.AttentionBackend
    monkeypatch.setattr(base, "resolve_prefill_shared_read_ends", _opt_out_resolver)
    _refused(f"envs attributes: envs lacks {OPT_IN}")

    _open_gate(monkeypatch, pm)
    warcore_sglang.install()  # the default setting: 0.5.23's switch, which is gone
    try:
        fb = SimpleNamespace(forward_mode=sgl.mode.EXTEND)
        trt = leaf("trtllm_mha", algorithm("none"))
        ours, _ = _never_earlier(trt.resolve_prefill_shared_read_ends, fb, num_qo_tokens=8)
        assert ours is sgl.ends.PRE_REPLAY
        monkeypatch.setenv(OPT_OUT, "1")  # an operator's opt-out: sglang's own code reads it
        ours, _ = _never_earlier(trt.resolve_prefill_shared_read_ends, fb, num_qo_tokens=8)
        assert ours is sgl.ends.UNKNOWN
        runner = SimpleNamespace(attn_backend=trt, spec_algorithm=algorithm("none"))
        assert trace.explain(runner, sgl.mode.EXTEND)[0] == "UNKNOWN"  # explained, not raised
    finally:
        warcore_sglang.uninstall()


# -- #35289 / #37237 / the DSpark prefetch worker: an owner read from per-step state ----------


def _per_step_owner(self: Any) -> Any:
    # the branch DSpark worker's shape: set per step, the class default standing in between
    return self._last_shared_read_runner or self._target_worker.model_runner


def _live_eagle(step_owner: str | None) -> tuple[Any, Any, Any]:
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    eagle = algorithm("sglang_eagle")
    target = SimpleNamespace(spec_algorithm=eagle, shared_read_done_event="t")
    draft = SimpleNamespace(spec_algorithm=eagle, shared_read_done_event="d")
    worker = bare(
        EAGLEWorkerV2,
        _target_worker=SimpleNamespace(model_runner=target),
        _draft_worker=SimpleNamespace(draft_runner=draft, last_draft_extend_staged=False),
    )
    if step_owner is not None:
        worker._last_shared_read_runner = {"target": target, "draft": draft}[step_owner]
    return worker, target, draft


def test_a_per_step_owner_with_a_class_default_is_refused_or_bounded(
    monkeypatch: pytest.MonkeyPatch, pm: Any
) -> None:
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    monkeypatch.setattr(EAGLEWorkerV2, "_last_shared_read_runner", None, raising=False)
    monkeypatch.setattr(EAGLEWorkerV2, "last_shared_read_runner", property(_per_step_owner))
    _refused("code of EAGLEWorkerV2.last_shared_read_runner")

    _open_gate(monkeypatch, pm)
    warcore_sglang.install()
    try:
        # warcore's owner, asked of a bare worker, is frozen at the class default: the target.
        # On a step where the draft reads last, the barrier must not take the target's event.
        worker, target, draft = _live_eagle("draft")
        runner = worker.last_shared_read_runner
        assert runner is not target and runner.shared_read_done_event is None
        assert target.shared_read_done_event is None and draft.shared_read_done_event is None
        # where sglang's step says the target, warcore agrees: the fine barrier stays
        worker, target, _ = _live_eagle("target")
        assert worker.last_shared_read_runner is target
        assert target.shared_read_done_event == "t"
    finally:
        warcore_sglang.uninstall()


# -- a fifth SharedReadEnds member --------------------------------------------------------


class _FiveEnds(Enum):
    PRE_REPLAY = 1
    IN_REPLAY = 2
    POST_REPLAY = 3
    AFTER_SAMPLING = 4
    UNKNOWN = 5

    @staticmethod
    def max_of(items: Any) -> Any:
        return max(items, key=lambda x: x.value)


def test_a_new_shared_read_ends_member_is_refused_or_bounded(
    monkeypatch: pytest.MonkeyPatch, pm: Any
) -> None:
    from _cells import backends
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    sgl = _sgl()
    oracle.api()  # warcore-sglang's view of sglang, taken before the change
    backends(algorithm("none"))  # every backend module imported with sglang's own enum
    monkeypatch.setattr(sgl.base, "SharedReadEnds", _FiveEnds)
    _refused("SharedReadEnds members")

    _open_gate(monkeypatch, pm)
    warcore_sglang.install()
    try:
        runner = bare(
            DecodeCudaGraphRunner,
            in_graph_metadata_prep_done=object(),
            model_runner=SimpleNamespace(shared_read_done_event="stale"),
        )
        for name in ("base", "trtllm_mha", "dsv4"):
            backend = leaf(name, algorithm("none"))
            for mode in (sgl.mode.DECODE, sgl.mode.EXTEND, sgl.mode.TARGET_VERIFY):
                _never_earlier(backend.shared_read_ends, mode)
                _never_earlier(runner._resolve_shared_read_ends, backend, mode)
    finally:
        warcore_sglang.uninstall()


# -- #31072 and a rename: the barrier itself ------------------------------------------------


def _host_wait_barrier(self: Any) -> None:
    # #31072: wait on the host for the reused event (an EP deadlock fix)
    if not self._war_barrier_enabled:
        return
    runner = self.model_worker.last_shared_read_runner
    event = runner.shared_read_done_event
    runner.shared_read_done_event = None
    if event is not None:
        event.synchronize()
    else:
        self.schedule_stream.wait_stream(self.forward_stream)


class _Event:
    def __init__(self) -> None:
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


def test_a_barrier_that_waits_on_the_host_is_refused_and_traced_as_unobserved(
    monkeypatch: pytest.MonkeyPatch, pm: Any, tmp_path: Path
) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "_apply_war_barrier", _host_wait_barrier)
    _refused("code of Scheduler._apply_war_barrier")

    path = tmp_path / "trace.jsonl"
    trace.install(path)
    try:
        event = _Event()
        owner = SimpleNamespace(shared_read_done_event=event, forward=None)
        scheduler = bare(
            Scheduler,
            _war_barrier_enabled=True,
            model_worker=SimpleNamespace(last_shared_read_runner=owner),
            schedule_stream=SimpleNamespace(wait_event=None, wait_stream=None),
            forward_stream=object(),
        )
        scheduler._apply_war_barrier()
    finally:
        trace.uninstall()
    assert event.synchronized == 1  # sglang's barrier ran as it is
    barrier = [r for r in trace.read_trace(path) if r["kind"] == "barrier"]
    assert [b["branch"] for b in barrier] == ["unobserved"], barrier  # not "disabled"


def test_a_renamed_barrier_is_refused_and_switches_its_observation_off(
    monkeypatch: pytest.MonkeyPatch, pm: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    original = vars(Scheduler)["_apply_war_barrier"]
    monkeypatch.delattr(Scheduler, "_apply_war_barrier")
    monkeypatch.setattr(Scheduler, "_apply_shared_read_barrier", original, raising=False)
    _refused("Scheduler._apply_war_barrier: not defined in sglang.srt.managers.scheduler")
    run_batch = vars(Scheduler)["run_batch"]
    with caplog.at_level(logging.ERROR, logger="warcore_sglang"):
        trace.install(tmp_path / "trace.jsonl")  # never raises into sglang's import
    try:
        assert vars(Scheduler)["run_batch"] is not run_batch  # the rest is observed
        assert "_apply_war_barrier" not in vars(Scheduler)
        lines = [r.getMessage() for r in caplog.records]
        assert any("Scheduler._apply_war_barrier is not there" in m for m in lines), lines
    finally:
        trace.uninstall()
    assert vars(Scheduler)["run_batch"] is run_batch


# -- the sanitizer: an SWA map that is not where 0.5.23 keeps it ----------------------------


def _swa_runner(mapping: bool) -> tuple[Any, Any]:
    import torch
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = bare(SWAKVPool, size=16, size_swa=8)
    if mapping:
        pool.full_to_swa_index_mapping = torch.arange(17, dtype=torch.int64) % 9
    runner = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(req_to_token=torch.arange(32).reshape(4, 8)),
        token_to_kv_pool=pool,
        is_hybrid_swa=True,
    )
    return runner, SimpleNamespace(req_pool_indices=torch.tensor([1, 2]))


@pytest.mark.parametrize("mapping", [True, False])
def test_an_swa_map_that_moved_is_not_covered_never_sound(mapping: bool) -> None:
    runner, batch = _swa_runner(mapping)
    before = runner.req_to_token_pool.req_to_token.clone()
    done = sanitize.poison_rows(runner, batch)
    missing = sanitize.not_covered(runner, done)
    assert not bool((runner.req_to_token_pool.req_to_token == before).all())  # poisoned
    sanitize.restore(done)
    assert bool((runner.req_to_token_pool.req_to_token == before).all())  # restored
    record = {
        "kind": "poison",
        "backend": "sglang_fa3",
        "mode": "EXTEND",
        "record_point": "pre_replay",
        "provenance": "plugin:sglang",
        "rids": ["warcore-sanitize-r0"],
        "buffers": [name for name, *_ in done],
        "not_covered": missing,
    }
    report = sanitize.compare([record], {"r0": [1, 2]}, {"warcore-sanitize-r0": [1, 2]})
    text = "\n".join(report.lines())
    if mapping:
        assert missing == [] and "sound" in text and report.ok, text
    else:
        assert missing == ["full_to_swa_index_mapping"]
        assert "NOT COVERED: full_to_swa_index_mapping" in text and "sound" not in text, text
        assert not report.ok


# -- a watched module that moved ---------------------------------------------------------


def test_a_watched_module_that_moved_is_named_and_takes_the_activation_off(
    monkeypatch: pytest.MonkeyPatch, pm: Any
) -> None:
    moved = "sglang.srt.managers.war_barrier"  # a module this sglang does not have
    replace_release(monkeypatch, watched={**RELEASE.watched, moved: "check"})
    told: list[str | None] = []
    base = cls(B + "AttentionBackend")
    original = vars(base)["shared_read_ends"]
    warcore_sglang.install(on_settled=told.append)
    assert told == [] and warcore_sglang.is_installed()  # not settled: one module pending
    assert vars(base)["shared_read_ends"] is not original
    checkpoint()  # the end of Scheduler.__init__
    assert not warcore_sglang.is_installed()
    assert vars(base)["shared_read_ends"] is original  # everything put back
    assert len(told) == 1 and told[0] is not None
    assert f"module {moved}" in told[0] and "sglang's own barrier decisions apply" in told[0]


def test_a_class_defined_later_that_fails_its_check_takes_the_activation_off(
    pm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    told: list[str | None] = []
    warcore_sglang.install(on_settled=told.append)
    checkpoint()
    assert told == [None] and warcore_sglang.is_installed()  # settled: active
    with caplog.at_level(logging.ERROR, logger="warcore.sglang"):

        class ReplantingRunner(DecodeCudaGraphRunner):  # sets the marker outside sglang's method
            def reset(self) -> None:
                self.in_graph_metadata_prep_done = None

    assert ReplantingRunner.__name__ == "ReplantingRunner"  # sglang's class statement stands
    assert not warcore_sglang.is_installed()
    del ReplantingRunner  # a subclass alive later would fail every later install's gate
    gc.collect()
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        "ReplantingRunner.in_graph_metadata_prep_done" in m and "warcore taken off" in m
        for m in lines
    ), lines


# -- the 0.5.23 workers, live-shaped: warcore's owner is sglang's ---------------------------


def test_warcore_owner_equals_sglangs_on_live_shaped_workers_for_every_algorithm_and_facts(
    installed: Any,
) -> None:
    from _cells import live_worker, worker_cases
    from warcore_sglang.activation import _owner

    seen = set()
    for name, _, klass, has_draft, staged in worker_cases():
        algo = algorithm(name)
        worker, target, draft = live_worker(klass, algo, has_draft, staged)
        with warcore_sglang.declarations.oracle.in_tree():
            try:
                own = worker.last_shared_read_runner  # sglang's own property
            except AttributeError:
                continue  # multi-layer EAGLE always has a draft worker in sglang
        ours = _owner._warcore_runner(worker, own)
        if own is draft and "draft" in RELEASE.unbounded_owners:  # 0.5.21: coarse
            assert ours is None, (name, klass.__qualname__, has_draft, staged)
        else:
            assert ours is own, (name, klass.__qualname__, has_draft, staged)
            assert worker.last_shared_read_runner is own  # the patched property: the same
        seen.add(name)
    assert seen == {
        "none",
        "sglang_eagle",
        "sglang_eagle3",
        "sglang_standalone",
        "sglang_frozen_kv_mtp",
        "sglang_dflash",
        "sglang_dspark",
    }
