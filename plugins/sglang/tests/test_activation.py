"""After ``warcore_sglang.install()``, sglang's own declaration points answer through warcore.

Everything is sglang 0.5.23's real code on bare objects: the decode runner is a bare
``DecodeCudaGraphRunner`` with ``in_graph_metadata_prep_done`` set (a planted in-graph event)
whose real ``_resolve_shared_read_ends`` (patched) is called with bare backends; the workers are
bare ``EAGLEWorkerV2`` etc. Third-party plugins are registered on warcore's process-wide plugin
manager, the one the activation consults.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import warcore_sglang
from _real import A, algorithm, bare, cls, hybrid, leaf, prefill
from _release import RELEASE

import warcore
from warcore import Declared, SharedReadBoundary
from warcore.audit.matrix import find_problems

W = warcore.ForwardMode


def _sgl() -> Any:
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode as SglMode

    return SimpleNamespace(ends=SharedReadEnds, mode=SglMode)


def _runner(planted: bool = True, **attrs: Any) -> Any:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    return bare(
        DecodeCudaGraphRunner,
        in_graph_metadata_prep_done=object() if planted else None,
        model_runner=SimpleNamespace(shared_read_done_event=None),
        **attrs,
    )


class Declares:
    """A third-party plugin: one declaration for one (backend, mode)."""

    def __init__(self, backend: str, mode: warcore.ForwardMode, answer: Any) -> None:
        self.backend, self.mode, self.answer = backend, mode, answer

    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: warcore.ForwardMode, context: warcore.BoundaryContext
    ) -> Any:
        if (backend, forward_mode) == (self.backend, self.mode):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer
        return None


# -- what install() patches, and that uninstall() restores it exactly ----------------------


def _patched_points() -> list[tuple[Any, str]]:
    from sglang.srt.managers.tp_worker import BaseTpWorker
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    base = cls(A + "base_attn_backend.AttentionBackend")
    points = [
        (DecodeCudaGraphRunner, "_resolve_shared_read_ends"),
        (base, "shared_read_ends"),
        (SpeculativeAlgorithm, "supports_prefill_shared_read_done"),
        (CustomSpecAlgo, "supports_prefill_shared_read_done"),
        (BaseTpWorker, "last_shared_read_runner"),
        (BaseSpecWorker, "last_shared_read_runner"),
        (EAGLEWorkerV2, "last_shared_read_runner"),
        (MultiLayerEagleWorkerV2, "last_shared_read_runner"),
    ]
    for path in (
        "trtllm_mha_backend.TRTLLMHAAttnBackend",
        "deepseek_v4_backend.DeepseekV4AttnBackend",
        "hybrid_attn_backend.HybridAttnBackend",
        "tbo_backend.TboAttnBackend",
        "hybrid_linear_attn_backend.HybridLinearAttnBackend",
        "dots_hybrid_backend.DotsSWAMLAAttnBackend",
        "minimax_sparse_backend.MiniMaxHybridAttnBackend",
        "minimax_sparse_nvfp4_backend.MiniMaxSparseNvfp4AttnBackend",  # 0.5.23 only
    ):
        if importlib.util.find_spec(A + path.rpartition(".")[0]) is not None:
            points.append((cls(A + path), "shared_read_ends"))
    # where the release decides a prefill: 0.5.23's resolver, else the publisher everywhere a
    # module binds it by name
    if "resolve_prefill_shared_read_ends" in vars(base):
        return [*points, (base, "resolve_prefill_shared_read_ends")]
    for module in (
        "sglang.srt.model_executor.runner_utils.shared_read_event",
        "sglang.srt.model_executor.runner_utils",
        "sglang.srt.model_executor.runner.eager_runner",
    ):
        points.append((importlib.import_module(module), "maybe_publish_prefill_shared_read_done"))
    return points


def test_install_patches_and_uninstall_restores_the_very_objects(pm: Any) -> None:
    points = _patched_points()
    before = {(owner, attr): vars(owner)[attr] for owner, attr in points}
    init_subclass = cls(A + "base_attn_backend.AttentionBackend").__dict__.get("__init_subclass__")
    assert init_subclass is None
    warcore_sglang.install()
    warcore_sglang.install()  # idempotent
    try:
        assert warcore_sglang.is_installed()
        for owner, attr in points:
            now = vars(owner)[attr]
            assert now is not before[(owner, attr)], (owner, attr)
            assert now.__warcore_original__ is before[(owner, attr)], (owner, attr)
    finally:
        warcore_sglang.uninstall()
        warcore_sglang.uninstall()  # idempotent
    assert not warcore_sglang.is_installed()
    for owner, attr in points:
        assert vars(owner)[attr] is before[(owner, attr)], (owner, attr)
    base = cls(A + "base_attn_backend.AttentionBackend")
    assert "__init_subclass__" not in vars(base)


def test_third_party_declaring_dsv4_decode_post_replay_moves_sglangs_decision(
    installed: Any,
) -> None:
    sgl = _sgl()
    runner, dsv4 = _runner(), leaf("dsv4", algorithm("none"))
    assert runner._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.IN_REPLAY
    installed.register(Declares("sglang_dsv4", W.DECODE, SharedReadBoundary.POST_REPLAY), "late")
    assert runner._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.POST_REPLAY
    assert dsv4.shared_read_ends(sgl.mode.DECODE) is sgl.ends.POST_REPLAY
    # Both plugins are named: the later one stands.
    res = warcore.resolve_shared_read_boundary("sglang_dsv4", W.DECODE, pm=installed)
    assert dict(res.answers) == {
        "sglang": SharedReadBoundary.IN_REPLAY,
        "late": SharedReadBoundary.POST_REPLAY,
    }
    installed.unregister(name="late")
    assert runner._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.IN_REPLAY
    assert "_warcore_sglang" in vars(dsv4)  # the per-instance cache ...
    warcore_sglang.uninstall()
    assert "_warcore_sglang" not in vars(dsv4)  # ... is taken off again


def test_a_runner_subclass_resolving_its_own_way_is_bounded_and_asked_once(installed: Any) -> None:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    sgl = _sgl()
    asked: list[Any] = []

    class EarlyRunner(DecodeCudaGraphRunner):  # defined while installed: patched at once
        def _resolve_shared_read_ends(self, attn_backend: Any, forward_mode: Any) -> Any:
            asked.append(forward_mode)
            return sgl.ends.PRE_REPLAY  # earlier than anything declared

    dsv4 = leaf("dsv4", algorithm("none"))
    runner = bare(
        EarlyRunner,
        in_graph_metadata_prep_done=object(),
        model_runner=SimpleNamespace(shared_read_done_event=None),
        attn_backend=dsv4,
        enable_pdmux=False,
    )
    plain = _runner(attn_backend=dsv4, enable_pdmux=False)
    for _ in range(3):  # its own answer bounded by the declaration (IN_REPLAY), remembered
        assert runner._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.IN_REPLAY
        assert plain._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.IN_REPLAY
    assert asked == [sgl.mode.DECODE]  # its own method, asked once
    warcore_sglang.uninstall()
    assert runner._resolve_shared_read_ends(dsv4, sgl.mode.DECODE) is sgl.ends.PRE_REPLAY


class _Capturing:
    """The device module of a CUDA runner whose graph is being captured (a CPU cannot
    capture): sglang's ``_record_in_graph_metadata_prep_done`` then plants its in-graph event."""

    class Event:
        def __init__(self, external: bool = False) -> None:
            self.recorded = 0

        def record(self) -> None:
            self.recorded += 1

    def is_current_stream_capturing(self) -> bool:
        return True


def test_the_runners_answers_are_remembered_only_while_nothing_changed(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.model_executor.runner_utils import shared_read_event

    monkeypatch.setattr(shared_read_event, "is_cuda", lambda: True)  # the platform check
    sgl = _sgl()
    dsv4 = leaf("dsv4", algorithm("none"))
    decode = sgl.mode.DECODE
    # a runner as sglang builds it: its own backend, set once, passed on every replay
    runner = _runner(planted=False, attn_backend=dsv4, enable_pdmux=False)
    for _ in range(2):  # resolved, then remembered by mode: the same answer
        assert runner._resolve_shared_read_ends(dsv4, decode) is sgl.ends.POST_REPLAY
    assert vars(runner)["_warcore_sglang_fast"] == {decode: sgl.ends.POST_REPLAY}
    # the runner plants its in-graph event (sglang's own method, at capture): forgotten, and
    # the planted answer is sglang's IN_REPLAY
    runner.device_module = _Capturing()
    runner._record_in_graph_metadata_prep_done()
    assert runner.in_graph_metadata_prep_done is not None
    for _ in range(2):
        assert runner._resolve_shared_read_ends(dsv4, decode) is sgl.ends.IN_REPLAY
    # a plugin registered: every remembered answer is forgotten at once
    installed.register(Declares("sglang_dsv4", W.DECODE, SharedReadBoundary.POST_REPLAY), "late")
    assert "_warcore_sglang_fast" not in vars(runner)
    assert runner._resolve_shared_read_ends(dsv4, decode) is sgl.ends.POST_REPLAY
    installed.unregister(name="late")
    # a pdmux runner replays several backends: no by-mode answers, each backend its own
    trt = leaf("trtllm_mha", algorithm("none"))
    installed.register(Declares("sglang_trtllm_mha", W.DECODE, SharedReadBoundary.UNKNOWN), "u")
    pdmux = _runner(attn_backend=dsv4, enable_pdmux=True)
    for _ in range(2):
        assert pdmux._resolve_shared_read_ends(trt, decode) is sgl.ends.UNKNOWN
        assert pdmux._resolve_shared_read_ends(dsv4, decode) is sgl.ends.IN_REPLAY
    assert "_warcore_sglang_fast" not in vars(pdmux)
    # an UNKNOWN clears the mailbox on every replay, remembered or not
    for _ in range(2):
        pdmux.model_runner.shared_read_done_event = "stale"
        assert pdmux._resolve_shared_read_ends(trt, decode) is sgl.ends.UNKNOWN
        assert pdmux.model_runner.shared_read_done_event is None
    warcore_sglang.uninstall()
    for holder in (runner, pdmux):
        assert "_warcore_sglang_fast" not in vars(holder)
        assert "_warcore_sglang_table" not in vars(holder)


def test_an_earlier_declaration_is_a_conflict_and_the_later_stands(installed: Any) -> None:
    sgl = _sgl()
    runner, dsv4 = _runner(), leaf("dsv4", algorithm("sglang_eagle"))
    verify = sgl.mode.TARGET_VERIFY
    assert runner._resolve_shared_read_ends(dsv4, verify) is sgl.ends.POST_REPLAY
    early = Declares("sglang_dsv4", W.TARGET_VERIFY, SharedReadBoundary.PRE_REPLAY)
    installed.register(early, "early")
    assert runner._resolve_shared_read_ends(dsv4, verify) is sgl.ends.POST_REPLAY
    ctx = warcore.BoundaryContext("sglang_eagle")
    res = warcore.resolve_shared_read_boundary("sglang_dsv4", W.TARGET_VERIFY, ctx, pm=installed)
    assert res.source == "default:conflict" and res.boundary is SharedReadBoundary.POST_REPLAY
    problems = [p for p in find_problems(installed) if p.startswith("conflict:")]
    assert any(
        "'sglang_dsv4' mode TARGET_VERIFY: early=PRE_REPLAY, sglang=POST_REPLAY" in p
        for p in problems
    ), problems


def test_a_raising_plugin_gives_unknown_and_clears_the_mailbox(installed: Any) -> None:
    sgl = _sgl()
    runner, trt = _runner(), leaf("trtllm_mha", algorithm("none"))
    installed.register(Declares("sglang_trtllm_mha", W.DECODE, RuntimeError("boom")), "boom")
    runner.model_runner.shared_read_done_event = "an event an earlier phase left"
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.UNKNOWN
    assert runner.model_runner.shared_read_done_event is None
    res = warcore.resolve_shared_read_boundary("sglang_trtllm_mha", W.DECODE, pm=installed)
    assert res.source == "default:failed:boom"
    # The lookup is cached: a second replay clears the mailbox again, without resolving.
    runner.model_runner.shared_read_done_event = "again"
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.UNKNOWN
    assert runner.model_runner.shared_read_done_event is None


def test_a_stale_range_declaration_is_not_applied(installed: Any) -> None:
    sgl = _sgl()
    runner, trt = _runner(), leaf("trtllm_mha", algorithm("none"))
    stale = Declared(SharedReadBoundary.PRE_REPLAY, "sglang>=0.6,<0.7")  # audited elsewhere
    installed.register(Declares("sglang_trtllm_mha", W.DECODE, stale), "stale")
    ends = runner._resolve_shared_read_ends(trt, sgl.mode.DECODE)
    assert ends is not sgl.ends.PRE_REPLAY
    assert ends is sgl.ends.UNKNOWN  # not applied: the coarse fence, whatever it claimed
    res = warcore.resolve_shared_read_boundary("sglang_trtllm_mha", W.DECODE, pm=installed)
    assert res.source == "stale:stale"
    assert any(p.startswith("stale declaration: plugin 'stale'") for p in find_problems(installed))


@pytest.mark.parametrize(
    "version", ["0.5.20", "0.5.24", "0.5.23.post1", "0.5.23.1", "0.5.23+g1234abc", "0.5.22.0"]
)
def test_install_refuses_every_version_but_the_audited_ones_exactly(
    pm: Any, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    from warcore_sglang.activation import UnsupportedSglangError
    from warcore_sglang.declarations import oracle as _sglang

    points = _patched_points()
    before = {(owner, attr): vars(owner)[attr] for owner, attr in points}
    monkeypatch.setattr(_sglang, "installed_version", lambda: version)
    with pytest.raises(UnsupportedSglangError) as info:
        warcore_sglang.install()
    message = str(info.value)
    assert f"sglang {version} at " in message
    assert "audited: 0.5.21, 0.5.22, 0.5.23, exactly" in message
    assert "sglang's own barrier decisions apply" in message
    assert not warcore_sglang.is_installed()
    assert all(vars(o)[a] is before[(o, a)] for o, a in points)


def test_force_coarse_and_vetoes_act_on_the_real_runner(installed: Any) -> None:
    sgl = _sgl()
    runner, trt = _runner(), leaf("trtllm_mha", algorithm("none"))
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.IN_REPLAY
    installed.set_force_coarse(True)
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.UNKNOWN
    installed.set_force_coarse(False)
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.IN_REPLAY

    class VetoDecode:
        @warcore.hookimpl
        def warcore_fast_path_veto(self, forward_mode: Any, context: Any) -> str | None:
            return "test veto" if forward_mode is W.DECODE else None

    installed.register(VetoDecode(), "veto")
    assert runner._resolve_shared_read_ends(trt, sgl.mode.DECODE) is sgl.ends.UNKNOWN
    assert trt.shared_read_ends(sgl.mode.EXTEND) is sgl.ends.PRE_REPLAY  # not vetoed


def test_the_prefill_gate_follows_warcore(installed: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sgl = _sgl()
    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "1")  # 0.5.21/0.5.22: off
    for name, publishes in (("none", True), ("sglang_eagle", False), ("sglang_dspark", True)):
        trt = leaf("trtllm_mha", algorithm(name))
        want = sgl.ends.PRE_REPLAY if publishes else sgl.ends.UNKNOWN
        for snapshot in (False, True):
            assert prefill(trt, snapshot=snapshot) is want, (name, snapshot)
        assert algorithm(name).supports_prefill_shared_read_done() is publishes
    # Not EXTEND: UNKNOWN, as sglang.
    trt = leaf("trtllm_mha", algorithm("none"))
    assert prefill(trt, sgl.mode.MIXED) is sgl.ends.UNKNOWN

    class VetoPrefill:
        @warcore.hookimpl
        def warcore_fast_path_veto(self, forward_mode: Any, context: Any) -> str | None:
            return "test offload" if forward_mode is W.EXTEND else None

    installed.register(VetoPrefill(), "veto")
    assert prefill(trt) is sgl.ends.UNKNOWN
    installed.unregister(name="veto")

    class NonePrefillOff:  # a plugin that says 'none' must not publish its prefill
        @warcore.hookimpl
        def warcore_is_war_publish_phase(self, algorithm: str, forward_mode: Any) -> Any:
            return False if (algorithm, forward_mode) == ("none", W.EXTEND) else None

    installed.register(NonePrefillOff(), "off")
    if hasattr(SpeculativeAlgorithm, "supports_prefill_shared_read_done"):
        assert SpeculativeAlgorithm.NONE.supports_prefill_shared_read_done() is False
    assert prefill(trt) is sgl.ends.UNKNOWN


def test_sglangs_own_switches_still_apply_to_prefill(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sgl = _sgl()
    trt = leaf("trtllm_mha", algorithm("none"))
    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "1")
    assert prefill(trt) is sgl.ends.PRE_REPLAY
    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "0")
    assert prefill(trt) is sgl.ends.UNKNOWN


def test_the_event_owner_follows_warcore(installed: Any) -> None:
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2

    eagle = algorithm("sglang_eagle")
    target = SimpleNamespace(spec_algorithm=eagle, shared_read_done_event="t")
    draft = SimpleNamespace(shared_read_done_event="d")

    def worker(klass: Any, with_draft: bool = True, staged: bool = False) -> Any:
        drafter = SimpleNamespace(draft_runner=draft, last_draft_extend_staged=staged)
        return bare(
            klass,
            _target_worker=SimpleNamespace(model_runner=target),
            _draft_worker=drafter if with_draft else None,
        )

    def owned_by_the_draft(runner: Any) -> bool:
        """The draft runner, or (where the release's draft runner publishes undeclared,
        0.5.21) a coarse barrier: never the target's event."""
        if "draft" not in RELEASE.unbounded_owners:
            return runner is draft
        return runner is not target and runner.shared_read_done_event is None

    assert owned_by_the_draft(worker(EAGLEWorkerV2).last_shared_read_runner)
    assert worker(EAGLEWorkerV2, with_draft=False).last_shared_read_runner is target
    assert owned_by_the_draft(worker(MultiLayerEagleWorkerV2).last_shared_read_runner)
    assert worker(MultiLayerEagleWorkerV2, staged=True).last_shared_read_runner is target
    plain_runner = SimpleNamespace(spec_algorithm=algorithm("none"), shared_read_done_event=None)
    plain = bare(TpModelWorker, _model_runner=plain_runner)
    assert plain.last_shared_read_runner is plain_runner
    assert plain.last_shared_read_runner is plain_runner  # the remembered answer

    class DraftOwns:  # a worker without a drafter: no such runner, no owner
        @warcore.hookimpl
        def warcore_step_event_owner(self, algorithm: str, facts: Any) -> str | None:
            return "draft"

    installed.register(DraftOwns(), "draft-owns")
    plain_runner.shared_read_done_event = "stale"
    runner = plain.last_shared_read_runner  # the remembered answer went with the plugin set
    assert runner is not plain_runner and runner.shared_read_done_event is None
    assert plain_runner.shared_read_done_event is None
    installed.unregister(name="draft-owns")
    assert plain.last_shared_read_runner is plain_runner

    class TargetOwns:  # disagrees with sglang's EAGLE worker: no owner, coarse barrier
        @warcore.hookimpl
        def warcore_step_event_owner(self, algorithm: str, facts: Any) -> str | None:
            return "target" if algorithm == "sglang_eagle" else None

    installed.register(TargetOwns(), "owner")
    runner = worker(EAGLEWorkerV2).last_shared_read_runner
    assert runner is not draft and runner is not target
    assert runner.shared_read_done_event is None
    assert target.shared_read_done_event is None and draft.shared_read_done_event is None
    installed.unregister(name="owner")
    draft.shared_read_done_event = "d"
    assert owned_by_the_draft(worker(EAGLEWorkerV2).last_shared_read_runner)


def test_a_backend_class_defined_after_install_is_patched_and_restored(
    pm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sgl = _sgl()
    base = cls(A + "base_attn_backend.AttentionBackend")
    warcore_sglang.install()
    try:

        class LateBackend(base):  # type: ignore[misc, valid-type]
            def shared_read_ends(self, fm: Any) -> Any:
                return sgl.ends.POST_REPLAY  # its own declaration

        own = LateBackend.__dict__["shared_read_ends"]
        assert LateBackend.__dict__["shared_read_ends"].__warcore_original__ is own.__wrapped__
        late = bare(LateBackend, model_runner=SimpleNamespace(spec_algorithm=algorithm("none")))
        with caplog.at_level(logging.WARNING, logger="warcore.sglang"):
            assert late.shared_read_ends(sgl.mode.DECODE) is sgl.ends.POST_REPLAY
        pm.set_force_coarse(True)
        assert late.shared_read_ends(sgl.mode.DECODE) is sgl.ends.UNKNOWN
        pm.set_force_coarse(False)
    finally:
        warcore_sglang.uninstall()
    assert LateBackend.__dict__["shared_read_ends"].__name__ == "shared_read_ends"
    assert not hasattr(LateBackend.__dict__["shared_read_ends"], "__warcore_original__")


def test_the_registry_builder_tags_each_backend_with_its_name(installed: Any) -> None:
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup

    trt_cls = cls(A + "trtllm_mha_backend.TRTLLMHAAttnBackend")

    @register_attention_backend("warcore_test")
    def _create(runner: Any) -> Any:  # an out-of-tree registration (sglang's own API)
        return bare(trt_cls, model_runner=runner)

    try:
        runner = SimpleNamespace(spec_algorithm=algorithm("none"))
        built = attention_backend_setup._build_full_attention_backend_from_str(
            model_runner=runner, backend_str="warcore_test", init_new_workspace=False
        )
        assert built.__dict__["_warcore_sglang_name"] == "sglang_warcore_test"
        from warcore_sglang.activation import identify

        assert identify(built)[0] == "sglang_warcore_test"
        # No class for that name in warcore-sglang's table: sglang's own answer stands.
        sgl = _sgl()
        assert built.shared_read_ends(sgl.mode.EXTEND) is sgl.ends.PRE_REPLAY
    finally:
        del ATTENTION_BACKENDS["warcore_test"]


def test_identify_names_wrappers_and_their_children() -> None:
    from warcore_sglang.activation import identify

    algo = algorithm("sglang_eagle")
    hyb = hybrid(leaf("trtllm_mha", algo), leaf("dsv4", algo), True)
    name, ctx = identify(hyb)
    assert name == "sglang_hybrid"
    assert ctx.algorithm == "sglang_eagle"
    assert dict(ctx.flags) == {
        "sglang_hybrid_prefill": "trtllm_mha",
        "sglang_hybrid_decode": "dsv4",
        "sglang_spec_attn_is_decode": True,
    }
    trtllm_sub = cls(A + "deepseek_v4_trtllm_backend.DeepseekV4TrtllmAttnBackend")
    assert identify(bare(trtllm_sub))[0] == "sglang_dsv4"  # inherits dsv4's declaration


def test_the_rank_check_runs_after_each_scheduler_starts(pm: Any, tmp_path: Any) -> None:
    import torch.distributed as dist
    from sglang.srt.managers.scheduler import Scheduler
    from warcore_sglang import activation

    original = vars(Scheduler)["__init__"]
    warcore_sglang.install(check_ranks=True)
    try:
        assert vars(Scheduler)["__init__"].__warcore_original__ is original
        cells = activation.rank_cells()
        assert {m for _, m, _ in cells} == {
            W.EXTEND,
            W.DECODE,
            W.TARGET_VERIFY,
            W.DRAFT_EXTEND_V2,
        }
        assert {"sglang_dsv4", "sglang_hybrid", "sglang_trtllm_mha"} <= {b for b, _, _ in cells}
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )
        try:
            activation._check_ranks(raise_on_mismatch=True)  # one rank: agrees with itself
        finally:
            dist.destroy_process_group()
    finally:
        warcore_sglang.uninstall()
    assert vars(Scheduler)["__init__"] is original


_LATE_WORKERS = """
import importlib, json, sys
import warcore_sglang
from warcore_sglang import activation
warcore_sglang.install()
importlib.import_module("sglang.srt.managers.scheduler")
seen = {}
for name, cls in [("eagle_worker_v2", "EAGLEWorkerV2"),
                  ("multi_layer_eagle_worker_v2", "MultiLayerEagleWorkerV2")]:
    module = importlib.import_module("sglang.srt.speculative." + name)  # as create_worker does
    owner = vars(getattr(module, cls))["last_shared_read_runner"]
    seen[name] = [activation.is_installed(), hasattr(owner, "__warcore_original__")]
print(json.dumps(seen))
"""


def test_a_worker_module_sglang_imports_after_the_scheduler_is_checked_and_patched() -> None:
    """sglang's ``create_worker`` imports the speculative worker modules late, after the
    scheduler: each worker class is checked while its class statement runs (its module does
    not name it yet). That check took the activation off in every EAGLE v2 server."""
    done = subprocess.run(
        [sys.executable, "-c", _LATE_WORKERS],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "eagle_worker_v2": [True, True],
        "multi_layer_eagle_worker_v2": [True, True],
    }, done.stderr[-3000:]


@pytest.mark.skipif(RELEASE.prefill != "resolver", reason="only 0.5.23 has the prefill resolver")
def test_sglangs_own_code_in_one_thread_leaves_another_threads_points_bounded(
    installed: Any,
) -> None:
    """While one thread is inside sglang's prefill resolver (whose nested declaration points
    answer sglang's own), another thread's patched points still answer warcore's bound: the
    depth that says "sglang's own code" is per thread."""
    import threading

    from warcore_sglang.declarations import oracle

    sgl = _sgl()
    installed.set_force_coarse(True)  # warcore's answer: UNKNOWN everywhere, sglang's: not
    inside, release = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}
    slow = leaf("triton", algorithm("none"))

    def snapshot(forward_batch: Any, *, num_qo_tokens: int) -> Any:
        seen["nested"] = slow.shared_read_ends(sgl.mode.DECODE)  # sglang's own, in this thread
        inside.set()
        assert release.wait(10)
        return sgl.ends.PRE_REPLAY

    slow._snapshot_prefill_shared_reads = snapshot
    batch = SimpleNamespace(forward_mode=sgl.mode.EXTEND)
    worker = threading.Thread(
        target=lambda: seen.update(
            answer=slow.resolve_prefill_shared_read_ends(batch, num_qo_tokens=8)
        )
    )
    worker.start()
    try:
        assert inside.wait(10)
        other = leaf("trtllm_mha", algorithm("none"))
        assert other.shared_read_ends(sgl.mode.DECODE) is sgl.ends.UNKNOWN  # bounded here
        assert _runner()._resolve_shared_read_ends(other, sgl.mode.DECODE) is sgl.ends.UNKNOWN
        # the resolver here: this thread's depth, though the other thread's call, the last
        # one, is inside sglang's code (a snapshot that asks no declaration: only the depth
        # the resolver itself reads tells sglang's answer from warcore's); in sglang's own
        # code here, sglang's answer
        quick = leaf("trtllm_mha", algorithm("none"))
        quick._snapshot_prefill_shared_reads = lambda fb, *, num_qo_tokens: sgl.ends.PRE_REPLAY
        assert quick.resolve_prefill_shared_read_ends(batch, num_qo_tokens=8) is sgl.ends.UNKNOWN
        with oracle.in_tree():
            own = quick.resolve_prefill_shared_read_ends(batch, num_qo_tokens=8)
        assert own is sgl.ends.PRE_REPLAY
        assert quick.resolve_prefill_shared_read_ends(batch, num_qo_tokens=8) is sgl.ends.UNKNOWN
    finally:
        release.set()
        worker.join(10)
    assert seen["nested"] is sgl.ends.IN_REPLAY  # the declaration as sglang states it
    assert seen["answer"] is sgl.ends.UNKNOWN  # sglang's PRE_REPLAY, bounded by force-coarse


@pytest.mark.skipif(RELEASE.prefill != "resolver", reason="only 0.5.23 has the prefill resolver")
def test_a_prefill_decision_that_fails_is_unknown_in_one_line_never_a_traceback(
    installed: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin raising on the prefill, or warcore's own decision failing there, is the
    coarse fence for the batch, said once naming what failed; sglang's call never raises."""
    from warcore_sglang.activation import _points

    sgl = _sgl()
    trt = leaf("trtllm_mha", algorithm("none"))
    installed.register(Declares("sglang_trtllm_mha", W.EXTEND, RuntimeError("boom")), "boom")
    assert prefill(trt) is sgl.ends.UNKNOWN  # the core names the plugin: default:failed:boom
    res = warcore.resolve_shared_read_boundary("sglang_trtllm_mha", W.EXTEND, pm=installed)
    assert res.source == "default:failed:boom"

    def broken(backend: Any, snapshot: bool) -> Any:
        raise ValueError("no decision")

    installed.unregister(name="boom")
    other = leaf("trtllm_mha", algorithm("none"))  # nothing remembered on it: the miss path
    monkeypatch.setattr(_points, "_prefill_mine", lambda b, s: sgl.ends.PRE_REPLAY)
    assert prefill(leaf("trtllm_mha", algorithm("none"))) is sgl.ends.PRE_REPLAY  # sglang's
    monkeypatch.setattr(_points, "_prefill_mine", broken)
    with caplog.at_level(logging.ERROR, logger="warcore"):
        for _ in range(3):
            assert prefill(other) is sgl.ends.UNKNOWN
    said = [r.getMessage() for r in caplog.records if "no decision" in r.getMessage()]
    assert len(said) == 1 and "prefill decision of TRTLLMHAAttnBackend" in said[0], said
    assert "UNKNOWN (coarse fence)" in said[0]
