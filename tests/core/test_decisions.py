"""Where each runner records its read-done event (DESIGN §4), through the real plugins.

The decode matrix reproduces sglang #34052's ``test_decode_cuda_graph_war_fence.py`` rows (the
pull request warcore was designed from), and adds the
rows where warcore differs on purpose (the soundness rule: a record point is never earlier than
the declared boundary). Backends and algorithms are the real ones: ``torch_native`` follows the
metadata contract, ``deepseek_v4`` declares ``POST_REPLAY`` for verify (``IN_REPLAY`` under
dspark), ``trtllm_mha`` declares ``PRE_REPLAY`` for ``EXTEND``; ``dflash``/``dspark`` publish at
verify and target ``EXTEND``, ``eagle`` at ``DRAFT_EXTEND_V2``, ``none`` at ``DECODE``/``EXTEND``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from _support import fresh_manager

from warcore.core import (
    NCCL_ALLGATHER_IN_OVERLAP,
    BoundaryContext,
    Decision,
    DecisionKey,
    Execution,
    ForwardMode,
    LoaderConfig,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    WarcorePluginManager,
    decide,
    get_decision_cache,
    get_registry,
    hookimpl,
    record_point,
)

pytestmark = pytest.mark.plugins()

M = ForwardMode
B = SharedReadBoundary
P = RecordPoint
PLANTED, UNPLANTED, EAGER = Execution.GRAPH_PLANTED, Execution.GRAPH_UNPLANTED, Execution.EAGER


def decode_record_point(
    mode: ForwardMode, declared: SharedReadBoundary, publishes: bool, execution: Execution
) -> RecordPoint:
    return record_point(RunnerKind.DECODE, mode, declared, publishes, execution)


def draft_extend_record_point(
    mode: ForwardMode, declared: SharedReadBoundary, publishes: bool, execution: Execution
) -> RecordPoint:
    return record_point(RunnerKind.DRAFT_EXTEND, mode, declared, publishes, execution)


def prefill_record_point(
    mode: ForwardMode, declared: SharedReadBoundary, publishes: bool
) -> RecordPoint:
    """The prefill runner's point does not depend on the execution: checked for each."""
    points = {record_point(RunnerKind.PREFILL, mode, declared, publishes, e) for e in Execution}
    assert len(points) == 1, points
    return points.pop()


REAL_PLUGINS = frozenset({"trtllm_mha", "deepseek_v4", "dflash"})


def _manager(plugins: frozenset[str] = REAL_PLUGINS) -> WarcorePluginManager:
    pm = fresh_manager(config=LoaderConfig(allowlist=plugins))
    assert {i.name for i in pm.plugin_infos if i.status == "active"} == plugins | {"warcore"}
    return pm


@pytest.fixture(scope="module")
def pm() -> WarcorePluginManager:
    return _manager()


def _decide(
    pm: WarcorePluginManager,
    kind: RunnerKind,
    backend: str,
    mode: ForwardMode,
    algorithm: str,
    execution: Execution,
    flags: dict[str, bool] | None = None,
) -> Decision:
    return decide(pm, kind, backend, mode, BoundaryContext(algorithm, flags or {}), execution)


# -- decode / target-verify runner ---------------------------------------------------------

# (algorithm, execution, backend, mode) -> (record point, provenance)
DECODE_MATRIX = [
    # sglang's rows. "algorithm publishes at verify: no" is `none` (and `eagle` below);
    # "default" backend is the contract-following torch_native; "verify POST_REPLAY" is
    # deepseek_v4 under a non-dspark algorithm.
    pytest.param("none", PLANTED, "torch_native", M.DECODE, P.IN_GRAPH_NODE, "contract:warcore",
                 id="sglang:planted-decode-contract->IN_REPLAY"),
    pytest.param("none", PLANTED, "torch_native", M.EXTEND, P.NONE, "default:no-answer",
                 id="sglang:extend-on-decode-runner->UNKNOWN"),
    pytest.param("none", PLANTED, "deepseek_v4", M.TARGET_VERIFY, P.NONE, "phase:plugin:warcore",
                 id="sglang:verify-not-publishing-post-replay->UNKNOWN"),
    pytest.param("dflash", PLANTED, "deepseek_v4", M.TARGET_VERIFY, P.POST_REPLAY,
                 "plugin:deepseek_v4", id="sglang:verify-publishing-post-replay->POST_REPLAY"),
    # sglang #34052 recorded IN_REPLAY before the replay when no node was planted (earlier than
    # declared); 0.5.23 records after the replay, as warcore does for a captured graph.
    # An eager decode records right after the in-graph init only because the core declares
    # torch_native's eager path on its own (the sanitizer shows it sound).
    pytest.param("none", EAGER, "torch_native", M.DECODE, P.AFTER_IN_GRAPH_INIT,
                 "plugin:warcore", id="warcore:eager-declared->after-in-graph-init"),
    pytest.param("none", UNPLANTED, "torch_native", M.DECODE, P.POST_REPLAY, "contract:warcore",
                 id="warcore:unplanted-captured->POST_REPLAY"),
    # The rows "Done when" adds.
    pytest.param("dspark", PLANTED, "deepseek_v4", M.TARGET_VERIFY, P.IN_GRAPH_NODE,
                 "plugin:deepseek_v4", id="verify-publishing-in-replay-planted->node"),
    pytest.param("dflash", PLANTED, "torch_native", M.TARGET_VERIFY, P.IN_GRAPH_NODE,
                 "contract:warcore", id="verify-publishing-contract-planted->node"),
    pytest.param("dspark", EAGER, "deepseek_v4", M.TARGET_VERIFY, P.AFTER_IN_GRAPH_INIT,
                 "plugin:deepseek_v4", id="verify-in-replay-eager->after-in-graph-init"),
    pytest.param("dspark", UNPLANTED, "deepseek_v4", M.TARGET_VERIFY, P.POST_REPLAY,
                 "plugin:deepseek_v4", id="verify-in-replay-unplanted->POST_REPLAY"),
    pytest.param("dflash", EAGER, "deepseek_v4", M.TARGET_VERIFY, P.POST_REPLAY,
                 "plugin:deepseek_v4", id="verify-post-replay-eager->POST_REPLAY"),
    pytest.param("eagle", PLANTED, "torch_native", M.TARGET_VERIFY, P.NONE,
                 "phase:plugin:warcore", id="eagle-verify-is-not-its-publish-phase"),
    pytest.param("eagle", PLANTED, "deepseek_v4", M.TARGET_VERIFY, P.NONE,
                 "phase:plugin:warcore", id="eagle-verify-post-replay-not-publishing"),
    pytest.param("none", PLANTED, "trtllm_mha", M.DECODE, P.IN_GRAPH_NODE, "contract:trtllm_mha",
                 id="plugin-abstains-on-decode->contract"),
    pytest.param("none", PLANTED, "deepseek_v4", M.DECODE, P.IN_GRAPH_NODE, "contract:deepseek_v4",
                 id="deepseek-decode->contract"),
    pytest.param("none", PLANTED, "torch_native", M.MIXED, P.NONE, "phase:plugin:warcore",
                 id="mixed-on-decode-runner->none"),
    pytest.param("none", PLANTED, "torch_native", M.IDLE, P.NONE, "phase:plugin:warcore",
                 id="idle-on-decode-runner->none"),
    pytest.param("eagle", PLANTED, "trtllm_mha", M.DRAFT_EXTEND_V2, P.NONE, "plugin:trtllm_mha",
                 id="draft-extend-on-decode-runner->none"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("algorithm", "execution", "backend", "mode", "expected", "source"), DECODE_MATRIX
)
def test_decode_runner_matrix(
    pm: WarcorePluginManager,
    algorithm: str,
    execution: Execution,
    backend: str,
    mode: ForwardMode,
    expected: RecordPoint,
    source: str,
) -> None:
    decision = _decide(pm, RunnerKind.DECODE, backend, mode, algorithm, execution)
    assert decision.record_point is expected
    assert decision.source == source


# The same rules on the pure function, with the declaration as an input (sglang's table form).
# The publish phase gates every mode: a False publishes nothing, decode included.
@pytest.mark.parametrize(
    ("publishes_at_verify", "execution", "declared", "mode", "expected"),
    [
        (True, PLANTED, B.IN_REPLAY, M.DECODE, P.IN_GRAPH_NODE),
        (True, UNPLANTED, B.IN_REPLAY, M.DECODE, P.POST_REPLAY),  # #34052: PRE_REPLAY
        (True, EAGER, B.IN_REPLAY, M.DECODE, P.AFTER_IN_GRAPH_INIT),
        (False, PLANTED, B.IN_REPLAY, M.DECODE, P.NONE),
        (False, EAGER, B.PRE_REPLAY, M.DECODE, P.NONE),
        (False, PLANTED, B.IN_REPLAY, M.EXTEND, P.NONE),
        (False, PLANTED, B.POST_REPLAY, M.TARGET_VERIFY, P.NONE),
        (True, PLANTED, B.POST_REPLAY, M.TARGET_VERIFY, P.POST_REPLAY),
        (True, PLANTED, B.IN_REPLAY, M.TARGET_VERIFY, P.IN_GRAPH_NODE),
        (True, PLANTED, B.PRE_REPLAY, M.DECODE, P.PRE_REPLAY),
        (True, PLANTED, B.UNKNOWN, M.TARGET_VERIFY, P.NONE),
    ],
)
def test_decode_record_point_pure(
    publishes_at_verify: bool,
    execution: Execution,
    declared: SharedReadBoundary,
    mode: ForwardMode,
    expected: RecordPoint,
) -> None:
    assert decode_record_point(mode, declared, publishes_at_verify, execution) is expected


# -- prefill runner ------------------------------------------------------------------------


def _prefill_expected(backend: str, mode: ForwardMode, algorithm: str) -> RecordPoint:
    # Only exactly EXTEND, an algorithm whose target EXTEND is the publish phase (none, the
    # dflash family; not eagle, whose draft-extend reads later) and a PRE_REPLAY backend
    # (deepseek_v4's is refined per batch at run time).
    publishes = mode is M.EXTEND and algorithm in {"none", "dflash", "dspark"}
    return P.PRE_REPLAY if publishes and backend in PRE_PREFILL else P.NONE


PRE_PREFILL = frozenset({"trtllm_mha", "deepseek_v4", "acme"})


def test_prefill_matrix_is_exhaustive_over_real_plugins(pm: WarcorePluginManager) -> None:
    registry = get_registry(pm)
    assert set(registry.backends) >= {"torch_native", "trtllm_mha", "deepseek_v4"}
    assert set(registry.algorithms) >= {"none", "eagle", "dflash", "dspark"}
    cells = itertools.product(sorted(registry.backends), M, sorted(registry.algorithms))
    for backend, mode, algorithm in cells:
        for execution in Execution:  # prefill publishes before the replay: execution is moot
            got = _decide(pm, RunnerKind.PREFILL, backend, mode, algorithm, execution)
            assert got.record_point is _prefill_expected(backend, mode, algorithm), (
                backend, mode, algorithm, execution,
            )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "mode", "algorithm", "expected", "source"),
    [
        ("trtllm_mha", M.EXTEND, "none", P.PRE_REPLAY, "plugin:trtllm_mha"),
        ("trtllm_mha", M.EXTEND, "dflash", P.PRE_REPLAY, "plugin:trtllm_mha"),
        ("trtllm_mha", M.EXTEND, "dspark", P.PRE_REPLAY, "plugin:trtllm_mha"),
        ("trtllm_mha", M.EXTEND, "eagle", P.NONE, "phase:plugin:warcore"),
        ("trtllm_mha", M.TARGET_VERIFY, "dflash", P.NONE, "contract:trtllm_mha"),
        ("trtllm_mha", M.MIXED, "none", P.NONE, "phase:plugin:warcore"),
        ("trtllm_mha", M.DECODE, "none", P.NONE, "contract:trtllm_mha"),
        ("torch_native", M.EXTEND, "none", P.NONE, "default:no-answer"),
        ("deepseek_v4", M.EXTEND, "dflash", P.PRE_REPLAY, "plugin:deepseek_v4"),
        ("deepseek_v4", M.EXTEND, "eagle", P.NONE, "phase:plugin:warcore"),
    ],
)
def test_prefill_matrix_rows(
    pm: WarcorePluginManager,
    backend: str,
    mode: ForwardMode,
    algorithm: str,
    expected: RecordPoint,
    source: str,
) -> None:
    decision = _decide(pm, RunnerKind.PREFILL, backend, mode, algorithm, PLANTED)
    assert decision.record_point is expected
    assert decision.source == source


def test_prefill_dflash_publishes_only_because_its_plugin_says_so() -> None:
    # Without the dflash plugin nobody answers for "dflash": not publishing (coarse fence).
    pm = _manager(frozenset({"trtllm_mha"}))
    decision = _decide(pm, RunnerKind.PREFILL, "trtllm_mha", M.EXTEND, "dflash", PLANTED)
    assert decision.record_point is P.NONE
    assert decision.publish.source == "default:no-answer"
    with_plugin = _decide(_manager(), RunnerKind.PREFILL, "trtllm_mha", M.EXTEND, "dflash", PLANTED)
    assert with_plugin.record_point is P.PRE_REPLAY
    assert with_plugin.publish.source == "plugin:dflash"


@pytest.mark.parametrize("declared", list(B))
@pytest.mark.parametrize("mode", list(M))
def test_prefill_record_point_pure(declared: SharedReadBoundary, mode: ForwardMode) -> None:
    for publishes in (False, True):
        got = prefill_record_point(mode, declared, publishes)
        publish = publishes and mode is M.EXTEND and declared is B.PRE_REPLAY
        assert got is (P.PRE_REPLAY if publish else P.NONE)


# -- EAGLE draft-extend runner -------------------------------------------------------------

NCCL = {NCCL_ALLGATHER_IN_OVERLAP: True}


@pytest.mark.parametrize(
    ("backend", "mode", "algorithm", "flags", "execution", "expected"),
    [
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", None, PLANTED, P.IN_GRAPH_NODE),
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", None, EAGER, P.AFTER_IN_GRAPH_INIT),
        # sglang #34052 degraded an unplanted IN_REPLAY to UNKNOWN here (0.5.23's draft-extend
        # runner records after the replay, as warcore does); warcore records after the
        # replay, which is sound and still overlaps the scheduler with the next step.
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", None, UNPLANTED, P.POST_REPLAY),
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", NCCL, PLANTED, P.POST_REPLAY),
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", NCCL, EAGER, P.POST_REPLAY),
        # The contract default covers decode and verify only: deepseek_v4's draft-extend is
        # not audited; the core declares torch_native's (its in-graph init gathers the table).
        ("torch_native", M.DRAFT_EXTEND_V2, "eagle", None, PLANTED, P.IN_GRAPH_NODE),
        ("deepseek_v4", M.DRAFT_EXTEND_V2, "eagle", None, PLANTED, P.NONE),
        # Not the publish phase of these algorithms.
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "dflash", None, PLANTED, P.NONE),
        ("trtllm_mha", M.DRAFT_EXTEND_V2, "none", None, PLANTED, P.NONE),
        # Other modes never publish on this runner.
        ("trtllm_mha", M.DRAFT_EXTEND, "eagle", None, PLANTED, P.NONE),
        ("trtllm_mha", M.DECODE, "eagle", None, PLANTED, P.NONE),
        ("trtllm_mha", M.EXTEND, "eagle", None, PLANTED, P.NONE),
    ],
)
def test_draft_extend_matrix(
    pm: WarcorePluginManager,
    backend: str,
    mode: ForwardMode,
    algorithm: str,
    flags: dict[str, bool] | None,
    execution: Execution,
    expected: RecordPoint,
) -> None:
    decision = _decide(pm, RunnerKind.DRAFT_EXTEND, backend, mode, algorithm, execution, flags)
    assert decision.record_point is expected


def test_draft_extend_declaration_depends_on_the_nccl_flag(pm: WarcorePluginManager) -> None:
    plain = _decide(pm, RunnerKind.DRAFT_EXTEND, "trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", PLANTED)
    nccl = _decide(
        pm, RunnerKind.DRAFT_EXTEND, "trtllm_mha", M.DRAFT_EXTEND_V2, "eagle", PLANTED, NCCL
    )
    assert (plain.declared.boundary, nccl.declared.boundary) == (B.IN_REPLAY, B.POST_REPLAY)
    assert plain.source == nccl.source == "plugin:trtllm_mha"


# -- the soundness rule, exhaustively ------------------------------------------------------

PureRule = Callable[[ForwardMode, SharedReadBoundary, bool, Execution], RecordPoint]
PURE_RULES: dict[str, PureRule] = {
    "decode": decode_record_point,
    "draft_extend": draft_extend_record_point,
    "prefill": lambda mode, declared, publishes, _execution: prefill_record_point(
        mode, declared, publishes
    ),
}


@pytest.mark.parametrize("rule", list(PURE_RULES))
def test_record_point_never_earlier_than_declared(rule: str) -> None:
    decide_point = PURE_RULES[rule]
    for mode, declared, publishes, execution in itertools.product(M, B, (False, True), Execution):
        point = decide_point(mode, declared, publishes, execution)
        where = (rule, mode, declared, publishes, execution, point)
        if point is P.NONE:
            continue
        assert declared is not B.UNKNOWN, where
        assert point.boundary >= declared, where
        # A point a runner cannot physically reach in this execution is never chosen.
        if execution is not PLANTED:
            assert point is not P.IN_GRAPH_NODE, where
        if execution is not EAGER:
            assert point is not P.AFTER_IN_GRAPH_INIT, where


def test_real_decisions_never_earlier_than_declared(pm: WarcorePluginManager) -> None:
    registry = get_registry(pm)
    cells = itertools.product(
        RunnerKind, sorted(registry.backends), M, sorted(registry.algorithms), Execution
    )
    published = 0
    for kind, backend, mode, algorithm, execution in cells:
        for flags in (None, NCCL):
            d = _decide(pm, kind, backend, mode, algorithm, execution, flags)
            if d.record_point.publishes:
                published += 1
                assert d.record_point.boundary >= d.declared.boundary, (d, kind, execution)
    assert published > 0  # the loop really exercised publishing cells


# -- the decision cache --------------------------------------------------------------------


class _CountingPlugin:
    """Answers for one backend and counts how often it is asked."""

    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext
    ) -> SharedReadBoundary | None:
        self.calls += 1
        return B.PRE_REPLAY if backend == "counted" else None


def test_decision_cache_resolves_once_then_is_a_dict_hit() -> None:
    pm = _manager()
    counter = _CountingPlugin()
    pm.register(counter, name="wctest_counter")
    cache = get_decision_cache(pm)
    assert get_decision_cache(pm) is cache
    key: DecisionKey = (RunnerKind.PREFILL, "counted", M.EXTEND, BoundaryContext("none"), PLANTED)
    first = cache[key]
    assert first.record_point is P.PRE_REPLAY and counter.calls == 1
    # An equal key built separately hits the same entry; no plugin is asked again.
    same = (RunnerKind.PREFILL, "counted", M.EXTEND, BoundaryContext("none", {}), PLANTED)
    for _ in range(100):
        assert cache[same] is first
    assert counter.calls == 1
    assert cache.record_point(key) is P.PRE_REPLAY
