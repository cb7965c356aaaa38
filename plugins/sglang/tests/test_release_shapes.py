"""Each audited release's own shape, on its real classes: where a release decides differently
from the others, warcore's answer is never earlier than that release's own answer for the
call, nor than declared.

* 0.5.21 and 0.5.22 decide a prefill publish in ``maybe_publish_prefill_shared_read_done``
  (the batch, its live declaration, the opt-in that defaults to off), a function their runners
  import by name: the patched publisher is what every caller binds, an event sglang published
  stays only where warcore's answer is PRE_REPLAY too, and warcore never publishes where sglang
  did not. Their dsv4 declares its EXTEND per batch (PRE_REPLAY only after its own snapshot
  ran): no answer of warcore's outlives the batch it was asked for.
* 0.5.21's decode runner answers a declared IN_REPLAY without the in-graph marker with
  PRE_REPLAY ("this lands EARLIER than declared"): with warcore active it is POST_REPLAY.
* 0.5.21's EAGLE draft-extend runner publishes before its replay without asking any
  declaration: a step owned by the draft runner is coarse with warcore active.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
import warcore_sglang
from _real import algorithm, bare, leaf
from _release import RELEASE, VERSION, publisher_only

import warcore
from warcore import SharedReadBoundary

W = warcore.ForwardMode
SRT = "sglang.srt."
PUBLISHER = "maybe_publish_prefill_shared_read_done"


def _sgl() -> SimpleNamespace:
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(ends=SharedReadEnds, mode=ForwardMode)


class _Event:
    def record(self) -> None:
        pass


_DEVICE = SimpleNamespace(Event=_Event)


class Declares:
    """A third-party plugin: one declaration for one (backend, mode)."""

    def __init__(self, backend: str, mode: warcore.ForwardMode, answer: SharedReadBoundary):
        self.backend, self.mode, self.answer = backend, mode, answer

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: warcore.ForwardMode, context: Any
    ) -> Any:
        if (backend, forward_mode) == (self.backend, self.mode):
            return self.answer
        return None


def _publish(backend: Any, algo: str = "none") -> Any:
    """What sglang's (patched, or not) prefill publisher leaves in the mailbox for one EXTEND
    batch, called the way its eager runner calls it: through the name that runner bound."""
    eager = sys.modules[SRT + "model_executor.runner.eager_runner"]
    runner = SimpleNamespace(
        attn_backend=backend,
        spec_algorithm=algorithm(algo),
        shared_read_done_event=None,
        prefill_shared_read_stager=None,
    )
    batch = SimpleNamespace(forward_mode=_sgl().mode.EXTEND)
    getattr(eager, PUBLISHER)(runner, batch, _DEVICE)
    return runner.shared_read_done_event


@pytest.fixture
def opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """sglang's own opt-in, off by default in 0.5.21 and 0.5.22, turned on."""
    import sglang.srt.model_executor.runner.eager_runner  # noqa: F401  (binds the publisher)

    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "1")


@publisher_only
def test_every_caller_binds_the_patched_publisher_and_gets_sglangs_back(pm: Any) -> None:
    import sglang.srt.model_executor.runner.eager_runner  # noqa: F401
    import sglang.srt.model_executor.runner.prefill_cuda_graph_runner  # noqa: F401

    names = [
        SRT + "model_executor.runner_utils.shared_read_event",
        SRT + "model_executor.runner_utils",
        SRT + "model_executor.runner.eager_runner",
        SRT + "model_executor.runner.prefill_cuda_graph_runner",
    ]
    before = {name: vars(sys.modules[name])[PUBLISHER] for name in names}
    assert len(set(map(id, before.values()))) == 1  # one function, bound by name four times
    # sglang's own, whatever this session installed and uninstalled before (a module imported
    # while installed binds the patched object: uninstalling must give it sglang's back)
    assert not hasattr(next(iter(before.values())), "__warcore_original__")
    warcore_sglang.install()
    try:
        patched = {name: vars(sys.modules[name])[PUBLISHER] for name in names}
        assert len(set(map(id, patched.values()))) == 1
        assert next(iter(patched.values())).__warcore_original__ is before[names[0]]
    finally:
        warcore_sglang.uninstall()
    assert {name: vars(sys.modules[name])[PUBLISHER] for name in names} == before


@publisher_only
def test_the_publisher_keeps_sglangs_event_only_where_warcore_agrees(
    pm: Any, opted_in: None
) -> None:
    trt = leaf("trtllm_mha", algorithm("none"))  # EXTEND PRE_REPLAY in every release
    assert _publish(trt) is not None  # sglang alone, opted in: published
    warcore_sglang.install()
    try:
        assert _publish(trt) is not None  # warcore agrees: the same event stays
        assert _publish(leaf("trtllm_mha", algorithm("sglang_eagle")), "sglang_eagle") is None
        pm.set_force_coarse(True)
        assert _publish(trt) is None  # warcore closed it: the mailbox emptied
        pm.set_force_coarse(False)
        pm.register(Declares("sglang_trtllm_mha", W.EXTEND, SharedReadBoundary.POST_REPLAY), "late")
        assert _publish(trt) is None  # a later declaration: not before the replay
    finally:
        warcore_sglang.uninstall()


@publisher_only
def test_warcore_never_publishes_where_sglang_did_not(
    pm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sglang.srt.model_executor.runner.eager_runner  # noqa: F401

    monkeypatch.delenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", raising=False)  # its default: off
    trt = leaf("trtllm_mha", algorithm("none"))
    pm.register(Declares("sglang_trtllm_mha", W.EXTEND, SharedReadBoundary.PRE_REPLAY), "early")
    warcore_sglang.install()
    try:
        assert _publish(trt) is None
        assert _publish(leaf("base", algorithm("none"))) is None  # declares UNKNOWN
    finally:
        warcore_sglang.uninstall()


def _dsv4() -> Any:
    from sglang.srt.layers.attention.deepseek_v4_backend import DSV4Metadata

    backend = leaf("dsv4", algorithm("none"))
    backend.forward_metadata = object.__new__(DSV4Metadata)
    return backend


@publisher_only
def test_a_per_batch_declaration_is_asked_per_batch_never_remembered(
    monkeypatch: pytest.MonkeyPatch, opted_in: None
) -> None:
    """dsv4's EXTEND is PRE_REPLAY only for a batch its own snapshot ran for: the same backend
    answers differently from batch to batch, and warcore follows it every time (its own answer
    for the name, PRE_REPLAY here, is what it remembers; a remembered bounded answer would say
    PRE_REPLAY for a batch sglang itself answers UNKNOWN for)."""
    sgl = _sgl()
    backend = _dsv4()
    monkeypatch.setenv("WARCORE_DISABLE_PLUGINS", "sglang")  # only the plugin below declares
    warcore.reset_plugin_manager()
    pm = warcore.get_plugin_manager()
    pm.register(Declares("sglang_dsv4", W.EXTEND, SharedReadBoundary.PRE_REPLAY), "early")
    warcore_sglang.install()
    try:
        for snapshotted in (True, False, True, False):
            backend.forward_metadata.prefill_shared_reads_snapshotted = snapshotted
            want = sgl.ends.PRE_REPLAY if snapshotted else sgl.ends.UNKNOWN
            assert backend.shared_read_ends(sgl.mode.EXTEND) is want, snapshotted
            assert (_publish(backend) is not None) is snapshotted, snapshotted
    finally:
        warcore_sglang.uninstall()
        monkeypatch.undo()
        warcore.reset_plugin_manager()


def _decode_runner(planted: bool) -> Any:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    return bare(
        DecodeCudaGraphRunner,
        in_graph_metadata_prep_done=object() if planted else None,
        model_runner=SimpleNamespace(shared_read_done_event=None),
    )


def test_an_unmarked_in_replay_decode_is_never_published_earlier_than_declared(pm: Any) -> None:
    """Declared IN_REPLAY, no in-graph marker (a HIP build, or capture without external
    events): the only sound record is after the replay. 0.5.21's own answer is PRE_REPLAY,
    earlier than declared; with warcore active the answer is never earlier than POST_REPLAY,
    on every release."""
    sgl = _sgl()
    backend = leaf("triton", algorithm("none"))  # the base declaration: DECODE IN_REPLAY
    declared = backend.shared_read_ends(sgl.mode.DECODE)
    assert declared is sgl.ends.IN_REPLAY
    own = _decode_runner(False)._resolve_shared_read_ends(backend, sgl.mode.DECODE)
    assert own is sgl.ends[RELEASE.decode_unmarked], (VERSION, own)  # the release's own
    warcore_sglang.install()
    try:
        ours = _decode_runner(False)._resolve_shared_read_ends(backend, sgl.mode.DECODE)
        planted = _decode_runner(True)._resolve_shared_read_ends(backend, sgl.mode.DECODE)
    finally:
        warcore_sglang.uninstall()
    assert ours is sgl.ends.POST_REPLAY and ours.value > declared.value
    assert planted is sgl.ends.IN_REPLAY  # with the marker: as declared, in every release


def test_a_step_owned_by_a_runner_that_publishes_undeclared_is_coarse(installed: Any) -> None:
    """The EAGLE worker names its draft runner when it has a draft model: in 0.5.21 that
    runner publishes before its replay without asking any declaration, so warcore makes the
    step coarse there; in the other releases the draft runner asks its (patched) backend, and
    the owner stands."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    algo = algorithm("sglang_eagle")
    target = SimpleNamespace(spec_algorithm=algo, shared_read_done_event=None)
    draft = SimpleNamespace(spec_algorithm=algo, shared_read_done_event=object())
    drafter = SimpleNamespace(draft_runner=draft, model_runner=draft)
    worker = bare(
        EAGLEWorkerV2,
        _target_worker=SimpleNamespace(model_runner=target),
        _draft_worker=drafter,
        _model_runner=target,
    )
    owner = worker.last_shared_read_runner
    if "draft" in RELEASE.unbounded_owners:
        assert owner is not draft and owner.shared_read_done_event is None  # coarse
        assert draft.shared_read_done_event is None  # its early event cannot outlive the step
    else:
        assert owner is draft


@pytest.mark.any_release
def test_the_version_list_ci_reads_names_the_audited_releases() -> None:
    from pathlib import Path

    from warcore_sglang.releases import RELEASES

    listed = Path(__file__).parents[1] / "sglang-releases.txt"
    lines = [ln.strip() for ln in listed.read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")] == list(RELEASES)
    for version in RELEASES:
        assert (listed.parent / f"sglang-{version}-pins.txt").is_file(), version
