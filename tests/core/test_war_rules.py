"""The rules sglang 0.5.23 added, as warcore states them: one table per rule.

Eager forwards, vetoes (offload flags, the prefill switch, force-coarse toggled while running, a
plugin's veto), per-batch prefill under and over its capacity, the three wrapper shapes, the
step's event owner, and the modes sglang 0.5.23 added. Declarations come from the real plugins
where they exist and from small test plugins where a rule needs one.
"""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

import pytest
from _support import fresh_manager
from _support.audit import TINY_MODEL

from warcore import (
    BoundaryContext,
    Declared,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    StepFacts,
    hookimpl,
    resolve_shared_read_boundary,
    resolve_step_event_owner,
)
from warcore.attention import AttentionBackend
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.matrix import build_matrix, find_problems
from warcore.audit.sanitizer import sanitize
from warcore.core import LoaderConfig, WarcorePluginManager, decide, get_decision_cache
from warcore.engine import Engine, EngineConfig, SchedulerConfig, synthetic_trace
from warcore.testing import DeclaredBackend, make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

B, M, P = SharedReadBoundary, ForwardMode, RecordPoint
PLANTED, EAGER = Execution.GRAPH_PLANTED, Execution.EAGER
SMALL: dict[str, Any] = {"requests": 4, "max_running": 2, "num_draft": 2, "model": TINY_MODEL}


def _decide(
    pm: WarcorePluginManager,
    kind: RunnerKind,
    backend: str | AttentionBackend,
    mode: ForwardMode,
    algorithm: str = "none",
    execution: Execution = PLANTED,
    flags: dict[str, Any] | None = None,
) -> Any:
    return decide(pm, kind, backend, mode, BoundaryContext(algorithm, flags or {}), execution)


class GraphOnly(TorchNativeBackend):
    """torch_native's code under another name, declared for its captured graph only."""

    name = "wctest_graph_only"


# -- eager forwards --------------------------------------------------------------------------


@pytest.mark.installed
@pytest.mark.parametrize(
    ("declarations", "eager", "mode", "execution", "point", "source"),
    [
        # The core declares torch_native's eager path (no separate eager body): the real point.
        pytest.param(None, None, M.DECODE, EAGER, P.AFTER_IN_GRAPH_INIT, "plugin:warcore",
                     id="builtin-eager-declared"),
        # A graph declaration alone: the eager forward records after the whole forward.
        pytest.param({M.DECODE: B.IN_REPLAY}, {}, M.DECODE, EAGER, P.POST_REPLAY,
                     "default:eager", id="graph-only->post"),
        pytest.param({}, {}, M.TARGET_VERIFY, EAGER, P.NONE, "default:no-answer",
                     id="undeclared->none"),
        pytest.param({M.DECODE: B.IN_REPLAY}, {}, M.DECODE, PLANTED, P.IN_GRAPH_NODE,
                     "plugin:DeclaredBackend", id="graph-still-in-graph"),
        # The eager path declared on its own, differently from the graph.
        pytest.param({M.DECODE: B.POST_REPLAY}, {M.DECODE: B.PRE_REPLAY}, M.DECODE, EAGER,
                     P.PRE_REPLAY, "plugin:DeclaredBackend", id="eager-declared-earlier"),
        pytest.param({M.DECODE: B.UNKNOWN}, {}, M.DECODE, EAGER, P.NONE, "plugin:DeclaredBackend",
                     id="graph-unknown->eager-none"),
    ],
)  # fmt: skip
def test_eager_forwards(
    declarations: dict[ForwardMode, SharedReadBoundary] | None,
    eager: dict[ForwardMode, SharedReadBoundary] | None,
    mode: ForwardMode,
    execution: Execution,
    point: RecordPoint,
    source: str,
) -> None:
    algorithm = "dflash" if mode is M.TARGET_VERIFY else "none"
    needs = ["dflash"] if algorithm == "dflash" else []
    if needs and "dflash" not in {ep.name for ep in md.entry_points(group="warcore")}:
        pytest.skip("needs the dflash plugin")
    if declarations is None:
        pm, backend = make_plugin_manager(), "torch_native"
    else:
        plugin = DeclaredBackend(GraphOnly, declarations, eager=eager)
        pm, backend = make_plugin_manager(plugin, entry_points=needs), "wctest_graph_only"
    decision = _decide(pm, RunnerKind.DECODE, backend, mode, algorithm, execution)
    assert (decision.record_point, decision.source) == (point, source)


@pytest.mark.plugins("dflash")
@pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY])
def test_an_early_eager_declaration_is_flagged_every_time(mode: ForwardMode) -> None:
    # torch_native's eager body reads the tables in its in-graph init: PRE_REPLAY is too early.
    plugin = DeclaredBackend(GraphOnly, {}, eager={mode: B.PRE_REPLAY})
    pm = make_plugin_manager(plugin, entry_points=["dflash"])
    algorithm = "dflash" if mode is M.TARGET_VERIFY else "none"
    flagged = 0
    for seed in range(10):
        report = sanitize(
            "wctest_graph_only", algorithm, pm=pm, use_graphs=False, seed=seed, **SMALL
        )
        v = report.violation
        assert v is not None, report.format()
        assert (v.forward_mode, v.record_point) == (mode, P.PRE_REPLAY)
        flagged += 1
    assert flagged == 10
    honest = make_plugin_manager(
        DeclaredBackend(GraphOnly, {}, eager={mode: B.IN_REPLAY}), entry_points=["dflash"]
    )
    assert sanitize("wctest_graph_only", algorithm, pm=honest, use_graphs=False, **SMALL).sound


class _GraphUnknown:
    """A graph-only plugin that has not audited torch_native's decode: UNKNOWN."""

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        return B.UNKNOWN if backend == "torch_native" and forward_mode is M.DECODE else None


def test_a_graph_unknown_is_never_overruled_by_an_eager_claim() -> None:
    pm = make_plugin_manager(_GraphUnknown())
    eager = _decide(pm, RunnerKind.DECODE, "torch_native", M.DECODE, "none", EAGER)
    assert eager.record_point is P.NONE  # the core's eager IN_REPLAY does not win over it


# -- vetoes ----------------------------------------------------------------------------------


@pytest.mark.plugins("trtllm_mha")
@pytest.mark.parametrize("flag", ["hicache", "hicache_storage", "lmcache"])
def test_offload_flags_veto_the_prefill_fast_path(flag: str) -> None:
    pm = make_plugin_manager(entry_points=["trtllm_mha"])
    assert _decide(pm, RunnerKind.PREFILL, "trtllm_mha", M.EXTEND).record_point is P.PRE_REPLAY
    vetoed = _decide(pm, RunnerKind.PREFILL, "trtllm_mha", M.EXTEND, flags={flag: True})
    assert vetoed.record_point is P.NONE
    assert vetoed.source.startswith("veto:warcore: host/storage KV offload")
    assert flag in vetoed.source
    # Decode is not vetoed by offload.
    decode = _decide(pm, RunnerKind.DECODE, "trtllm_mha", M.DECODE, flags={flag: True})
    assert decode.record_point is P.IN_GRAPH_NODE


@pytest.mark.plugins("trtllm_mha")
def test_the_prefill_switch_from_the_environment_and_at_run_time() -> None:
    off = LoaderConfig.from_env({"WARCORE_PREFILL_FAST_PATH": "0"})
    pm = fresh_manager(config=off)
    vetoed = _decide(pm, RunnerKind.PREFILL, "trtllm_mha", M.EXTEND)
    assert vetoed.record_point is P.NONE
    assert vetoed.source == "veto:warcore: the prefill fast path is switched off " + (
        "(WARCORE_PREFILL_FAST_PATH)"
    )
    cache = get_decision_cache(pm)
    key = (RunnerKind.PREFILL, "trtllm_mha", M.EXTEND, BoundaryContext(), EAGER)
    handle = cache.handle(key)
    assert cache[handle].record_point is P.NONE
    pm.set_prefill_fast_path(True)  # while running: the held handle sees it on its next lookup
    assert cache[handle].record_point is P.PRE_REPLAY
    pm.set_prefill_fast_path(False)
    assert cache[handle].record_point is P.NONE
    with pytest.raises(ValueError, match="WARCORE_PREFILL_FAST_PATH"):
        LoaderConfig.from_env({"WARCORE_PREFILL_FAST_PATH": "maybe"})


def test_force_coarse_toggled_while_an_engine_runs() -> None:
    pm = make_plugin_manager()
    trace = synthetic_trace(24, seed=3, output_len=(6, 14))
    config = EngineConfig(
        model=TINY_MODEL, scheduler=SchedulerConfig(max_running=4), num_slots=1024
    )
    switched: list[int] = []

    def halfway(tokens: int, total: int) -> None:
        if not switched and tokens >= total // 2:
            pm.set_force_coarse(True)  # from inside the loop, between two steps
            switched.append(tokens)

    with Engine(config, pm=pm) as engine:
        report = engine.run(trace, progress=halfway)
        assert switched
        # Before the switch the decode graph published at its node and barriers were fine;
        # after it, every replay followed the new decision and every barrier was coarse.
        assert report.published[(M.DECODE, P.IN_GRAPH_NODE)] > 0
        assert report.published[(M.DECODE, P.NONE)] > 0
        assert report.barriers["fine"] > 0 and report.barriers["coarse"] > 0
        assert not report.errors
        pm.set_force_coarse(False)
        again = engine.run(trace)
        assert again.outputs == report.outputs
        assert again.published[(M.DECODE, P.NONE)] == 0


class _Vetoer:
    def __init__(self, mode: ForwardMode, reason: object = "our offloader copies KV late") -> None:
        self.mode, self.reason = mode, reason

    @hookimpl
    def warcore_fast_path_veto(self, forward_mode: ForwardMode, context: BoundaryContext) -> Any:
        if forward_mode is not self.mode:
            return None
        if isinstance(self.reason, Exception):
            raise self.reason
        return self.reason


@pytest.mark.parametrize(
    ("reason", "by", "says"),
    [
        ("our offloader copies KV late", "wctest_vetoer", "our offloader copies KV late"),
        (RuntimeError("boom"), "failed:wctest_vetoer", "RuntimeError: boom"),
        (42, "failed:wctest_vetoer", "returned 42"),
    ],
)
def test_a_plugins_veto_names_who_and_why_in_the_matrix(reason: Any, by: str, says: str) -> None:
    pm = make_plugin_manager()
    pm.register(_Vetoer(M.DECODE, reason), name="wctest_vetoer")
    rows = [r for r in build_matrix(pm) if r.backend == "torch_native" and r.algorithm == "none"]
    decode = next(r.as_dict() for r in rows if r.mode is M.DECODE)
    assert decode["record_point"] == "none"
    assert decode["vetoes"][0]["by"] == by and says in decode["vetoes"][0]["reason"]
    assert decode["source"].startswith(f"veto:{by}: ")
    # Only the vetoed mode.
    verify_runner = next(r.as_dict() for r in rows if r.mode is M.EXTEND)
    assert verify_runner["vetoes"] == []
    if by.startswith("failed:"):
        assert any(
            "wctest_vetoer" in p and "warcore_fast_path_veto" in p for p in find_problems(pm)
        )


# -- per-batch prefill -----------------------------------------------------------------------


def _deepseek_prefills(trace_len: int, prompt: tuple[int, int], **kw: Any) -> Any:
    config = EngineConfig(
        backend="deepseek_v4",
        model=TINY_MODEL,
        scheduler=SchedulerConfig(max_running=4, max_prefill_requests=4),
        num_slots=1024,
        loop="serial",
        **kw,
    )
    trace = synthetic_trace(trace_len, seed=5, prompt_len=prompt, output_len=(2, 4))
    with Engine(config) as engine:
        return engine.run(trace)


@pytest.mark.plugins("deepseek_v4")
def test_per_batch_prefill_under_and_over_its_snapshot_capacity() -> None:
    from warcore_deepseek_v4.backend import SNAPSHOT_TOKENS

    small = _deepseek_prefills(6, (4, 8))  # at most 4 x 8 = 32 tokens a batch: all fit
    assert SNAPSHOT_TOKENS >= 32
    assert small.published[(M.EXTEND, P.PRE_REPLAY)] == small.forwards[M.EXTEND] > 0
    large = _deepseek_prefills(6, (40, 60))  # every batch is over the capacity
    assert large.published[(M.EXTEND, P.NONE)] == large.forwards[M.EXTEND] > 0
    assert large.published[(M.EXTEND, P.PRE_REPLAY)] == 0


@pytest.mark.plugins("deepseek_v4")
def test_per_batch_prefill_is_sound_both_ways_and_a_lying_refinement_is_flagged() -> None:
    from warcore_deepseek_v4.backend import DeepseekV4Backend

    from warcore.engine import Request

    for low, high in ((4, 8), (40, 60)):  # under, then over the snapshot's capacity
        trace = [Request(i, list(range(1, low + 1 + i % (high - low))), 3) for i in range(4)]
        report = sanitize("deepseek_v4", "none", requests=trace, max_running=4,
                          model=TINY_MODEL)  # fmt: skip
        assert report.sound, report.format()

    class AlwaysFits(DeepseekV4Backend):
        """Claims every batch fits its snapshot: large batches still read in every layer."""

        def refine_prefill_boundary(self, batch: Any) -> SharedReadBoundary:
            return B.PRE_REPLAY

    plugin = DeclaredBackend(AlwaysFits, {M.EXTEND: B.PRE_REPLAY}, name="deepseek_v4")
    pm = make_plugin_manager(plugin, builtins="algorithms")
    big = [Request(i, list(range(1, 41 + i)), 3) for i in range(4)]
    for _ in range(10):
        report = sanitize("deepseek_v4", "none", pm=pm, requests=big, max_running=4,
                          model=TINY_MODEL)  # fmt: skip
        assert report.violation is not None, report.format()
        assert report.violation.forward_mode is M.EXTEND


def test_the_refinement_is_not_asked_when_the_decision_does_not_publish() -> None:
    asked: list[int] = []

    class Counting(TorchNativeBackend):
        name = "wctest_counting"

        def refine_prefill_boundary(self, batch: Any) -> SharedReadBoundary:
            asked.append(batch.batch_size)
            return B.PRE_REPLAY

    plugin = DeclaredBackend(Counting, {M.EXTEND: B.PRE_REPLAY})
    pm = make_plugin_manager(plugin, builtins="algorithms")
    config = EngineConfig(backend="wctest_counting", model=TINY_MODEL, loop="serial",
                          flags=(("lmcache", True),))  # fmt: skip
    with Engine(config, pm=pm) as engine:
        report = engine.run(synthetic_trace(3, seed=1, output_len=(2, 3)))
    assert report.published[(M.EXTEND, P.NONE)] > 0 and asked == []  # the veto's authority


# -- wrappers --------------------------------------------------------------------------------

HYBRID = {"hybrid_prefill_backend": "trtllm_mha", "hybrid_decode_backend": "deepseek_v4"}


@pytest.mark.plugins()
@pytest.mark.parametrize(
    ("backend", "flags", "mode", "algorithm", "boundary", "source"),
    [
        # Selecting (sglang's HybridAttnBackend): one child per mode.
        ("hybrid", HYBRID, M.EXTEND, "none", B.PRE_REPLAY, "plugin:trtllm_mha"),
        ("hybrid", HYBRID, M.DECODE, "none", B.IN_REPLAY, "contract:deepseek_v4"),
        ("hybrid", HYBRID, M.TARGET_VERIFY, "dflash", B.POST_REPLAY, "plugin:deepseek_v4"),
        ("hybrid", {**HYBRID, "spec_attn_is_decode": False}, M.TARGET_VERIFY, "dflash",
         B.IN_REPLAY, "contract:trtllm_mha"),
        # Latest of all children (hybrid linear, two-batch overlap, MiniMax).
        ("layer_hybrid", {"layer_hybrid_backends": "trtllm_mha,deepseek_v4"}, M.TARGET_VERIFY,
         "dflash", B.POST_REPLAY, "plugin:deepseek_v4"),
        ("layer_hybrid", {"layer_hybrid_backends": "trtllm_mha,deepseek_v4"}, M.EXTEND, "none",
         B.PRE_REPLAY, "plugin:deepseek_v4+trtllm_mha"),
        ("layer_hybrid", {"layer_hybrid_backends": "trtllm_mha,torch_native"}, M.EXTEND, "none",
         B.UNKNOWN, "default:no-answer"),
    ],
)  # fmt: skip
def test_wrapper_shapes_by_name_and_by_instance(
    backend: str,
    flags: dict[str, Any],
    mode: ForwardMode,
    algorithm: str,
    boundary: SharedReadBoundary,
    source: str,
) -> None:
    pm = make_plugin_manager(entry_points=["trtllm_mha", "deepseek_v4", "dflash"])
    ctx = BoundaryContext(algorithm, flags)
    by_name = resolve_shared_read_boundary(backend, mode, ctx, pm=pm)
    if source == "plugin:deepseek_v4+trtllm_mha":  # both children declare PRE_REPLAY
        assert by_name.boundary is boundary
        assert {c.source for c in by_name.children} == {"plugin:deepseek_v4", "plugin:trtllm_mha"}
    else:
        assert (by_name.boundary, by_name.source) == (boundary, source)


class _DotsLike:
    """sglang's dots hybrid: the wrapper itself is UNKNOWN for plain (non-speculative) extend."""

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext
    ) -> SharedReadBoundary | None:
        if backend == "hybrid" and forward_mode is M.EXTEND and context.algorithm == "none":
            return B.UNKNOWN
        return None


@pytest.mark.plugins("trtllm_mha", "dflash")
def test_a_wrappers_own_declaration_combines_with_its_child() -> None:
    pm = make_plugin_manager(_DotsLike(), entry_points=["trtllm_mha", "dflash"])
    plain = resolve_shared_read_boundary("hybrid", M.EXTEND, BoundaryContext("none", HYBRID), pm=pm)
    assert (plain.boundary, plain.source) == (B.UNKNOWN, "plugin:_DotsLike")
    spec = resolve_shared_read_boundary(
        "hybrid", M.EXTEND, BoundaryContext("dflash", HYBRID), pm=pm
    )
    assert (spec.boundary, spec.source) == (B.PRE_REPLAY, "plugin:trtllm_mha")


@pytest.mark.plugins()
@pytest.mark.parametrize(
    ("backend", "flags"),
    [
        ("hybrid", HYBRID),
        ("hybrid", {**HYBRID, "spec_attn_is_decode": False}),
        ("layer_hybrid", {"layer_hybrid_backends": "trtllm_mha,deepseek_v4"}),
    ],
)
@pytest.mark.parametrize("algorithm", ["none", "dflash", "eagle"])
def test_wrappers_are_sanitized_sound(backend: str, flags: dict[str, Any], algorithm: str) -> None:
    report = sanitize(backend, algorithm, flags=flags, **SMALL)
    assert report.sound, report.format()
    # deepseek_v4 declares no draft-extend: through layer_hybrid eagle publishes nothing.
    assert report.checked > 0 or (backend, algorithm) == ("layer_hybrid", "eagle")


@pytest.mark.plugins("dflash", "deepseek_v4")
@pytest.mark.parametrize(
    ("backend", "flags"),
    [
        ("hybrid", {"hybrid_decode_backend": "deepseek_v4"}),
        ("layer_hybrid", {"layer_hybrid_backends": "torch_native,deepseek_v4"}),
    ],
)
def test_an_early_declaration_through_a_wrapper_is_flagged_every_time(
    backend: str, flags: dict[str, Any]
) -> None:
    from warcore_deepseek_v4.backend import DeepseekV4Backend

    plugin = DeclaredBackend(DeepseekV4Backend, {M.TARGET_VERIFY: B.IN_REPLAY})
    pm = make_plugin_manager(plugin, entry_points=["dflash"])
    flagged = 0
    for seed in range(10):
        report = sanitize(backend, "dflash", pm=pm, flags=flags, seed=seed, **SMALL)
        assert report.violation is not None, report.format()
        assert report.violation.forward_mode is M.TARGET_VERIFY
        flagged += 1
    assert flagged == 10


# -- the step's event owner ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "facts", "owner", "source"),
    [
        ("none", StepFacts(has_draft_model=False), "target", "plugin:warcore"),
        ("eagle", StepFacts(), "draft", "plugin:warcore"),
        ("eagle", StepFacts(has_draft_model=False), "target", "plugin:warcore"),
        ("eagle", StepFacts(draft_extend_staged=True), "target", "plugin:warcore"),
        ("someone_elses", StepFacts(), "target", "default:target"),
    ],
)
def test_the_steps_event_owner(algorithm: str, facts: StepFacts, owner: str, source: str) -> None:
    pm = make_plugin_manager()
    resolved = resolve_step_event_owner(algorithm, facts, pm=pm)
    assert (resolved.owner, resolved.source) == (owner, source)
    cache = get_decision_cache(pm)
    assert cache.event_owner(algorithm, facts) == resolved
    assert cache.event_owner(algorithm, facts) is cache.event_owner(algorithm, facts)


class _Owner:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    @hookimpl
    def warcore_step_event_owner(self, algorithm: str, facts: StepFacts) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer if algorithm == "eagle" else None


@pytest.mark.parametrize("answer", [RuntimeError("x"), "scheduler", "target"])
def test_a_doubtful_owner_is_no_owner(answer: Any) -> None:
    pm = make_plugin_manager()
    pm.register(_Owner(answer), name="wctest_owner")
    resolved = resolve_step_event_owner("eagle", StepFacts(), pm=pm)
    # A failure, a wrong value, or a disagreement with the core's "draft": the coarse fence.
    assert resolved.owner is None
    assert resolved.source in ("default:failed:wctest_owner", "default:conflict")


def test_the_engine_barrier_takes_the_owners_event() -> None:
    pm = make_plugin_manager()
    config = EngineConfig(algorithm="eagle", model=TINY_MODEL, num_draft=2, num_slots=1024)
    with Engine(config, pm=pm) as engine:
        assert engine.worker.mailbox is engine.runners[1]  # the draft runner
        fine = engine.run(synthetic_trace(6, seed=2, output_len=(3, 6)))
        assert fine.barriers["fine"] > 0
        pm.register(_Owner(RuntimeError("doubt")), name="wctest_owner")
        assert engine.worker.mailbox is None
        doubtful = engine.run(synthetic_trace(6, seed=2, output_len=(3, 6)))
        assert doubtful.barriers["fine"] == 0 and doubtful.outputs == fine.outputs


# -- the modes sglang 0.5.23 added -----------------------------------------------------------


class _NewModes:
    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        if backend != "torch_native":
            return None
        return {
            M.parse("PREBUILT"): B.IN_REPLAY,
            M.parse("SPLIT_PREFILL"): B.POST_REPLAY,
            M.parse("DLLM_EXTEND"): B.PRE_REPLAY,
        }.get(forward_mode)


@pytest.mark.parametrize(
    ("name", "boundary"),
    [("PREBUILT", B.IN_REPLAY), ("SPLIT_PREFILL", B.POST_REPLAY), ("DLLM_EXTEND", B.PRE_REPLAY)],
)
def test_declarations_for_the_modes_sglang_0_5_23_added(
    name: str, boundary: SharedReadBoundary
) -> None:
    pm = make_plugin_manager(_NewModes())
    resolved = resolve_shared_read_boundary("torch_native", name, pm=pm)
    assert (resolved.boundary, resolved.source) == (boundary, "plugin:_NewModes")
    row = next(
        r.as_dict()
        for r in build_matrix(pm)
        if (r.backend, r.mode.name, r.algorithm) == ("torch_native", name, "none")
    )
    assert row["boundary"] == boundary.name and row["boundary_source"] == "plugin:_NewModes"
    assert M.parse(name.lower()) is M.parse(name)


# -- scoped declarations ---------------------------------------------------------------------


class _Scoped:
    def __init__(self, implementation: str) -> None:
        self.implementation = implementation

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> Declared | None:
        if backend == "torch_native" and forward_mode is M.DECODE:
            return Declared(B.POST_REPLAY, self.implementation)
        return None


@pytest.mark.parametrize(
    ("implementation", "boundary", "source"),
    [
        ("warcore>=0.1,<0.2", B.POST_REPLAY, "plugin:wctest_scoped"),
        ("warcore>=9", B.UNKNOWN, "stale:wctest_scoped"),
        ("not-installed-anywhere>=1", B.UNKNOWN, "stale:wctest_scoped"),
    ],
)
def test_scoped_declarations_outside_their_range_are_not_applied(
    implementation: str, boundary: SharedReadBoundary, source: str
) -> None:
    pm = make_plugin_manager()
    pm.register(_Scoped(implementation), name="wctest_scoped")
    resolved = resolve_shared_read_boundary("torch_native", M.DECODE, pm=pm)
    assert (resolved.boundary, resolved.source) == (boundary, source)
    stale = [p for p in find_problems(pm) if p.startswith("stale declaration")]
    assert bool(stale) is source.startswith("stale")
    if stale:
        assert "'wctest_scoped'" in stale[0]


def test_a_malformed_range_fails_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="invalid implementation range 'sglang>>1'"):
        Declared(B.IN_REPLAY, "sglang>>1")


# -- a backend's own code failing in the new entry points ------------------------------------


class _RaisingRefine(TorchNativeBackend):
    name = "wctest_raising_refine"

    def refine_prefill_boundary(self, batch: Any) -> SharedReadBoundary:
        raise RuntimeError("refine boom")


class _RaisingChildren(TorchNativeBackend):
    name = "wctest_raising_children"

    def children_for(self, forward_mode: ForwardMode, context: BoundaryContext) -> Any:
        raise RuntimeError("children boom")


@pytest.mark.parametrize("cls", [_RaisingRefine, _RaisingChildren])
def test_a_raising_refinement_or_children_for_is_the_coarse_fence_not_a_crash(
    cls: type[TorchNativeBackend],
) -> None:
    pm = make_plugin_manager(DeclaredBackend(cls, {M.EXTEND: B.PRE_REPLAY}), builtins="algorithms")
    config = EngineConfig(backend=cls.name, model=TINY_MODEL, num_slots=1024)
    with Engine(config, pm=pm) as engine:
        report = engine.run(synthetic_trace(4, seed=1, output_len=(2, 3)))
    assert not report.errors and report.stopped is None
    assert report.published[(M.EXTEND, P.PRE_REPLAY)] == 0  # never earlier than declared
    assert report.published[(M.EXTEND, P.NONE)] == report.forwards[M.EXTEND] > 0
    if cls is _RaisingChildren:
        d = _decide(pm, RunnerKind.DECODE, engine.runner.backend, M.DECODE)
        assert d.record_point is P.NONE
        assert d.source == "default:failed:backend:wctest_raising_children"
