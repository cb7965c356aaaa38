"""Every backend of the core and the plugins, every mode: a declaration one step earlier than
the code allows is flagged in 10 runs out of 10, and the honest declarations never are.

Each case is a fresh plugin manager holding the core's algorithms (and dflash's, for verify)
and a test plugin that offers the backend's own class under the declarations being tested, so
the backend's real plugin is not involved.
"""

from __future__ import annotations

from typing import Any

import pytest
from _support.audit import TINY_MODEL, backend_class

from warcore import ForwardMode, SharedReadBoundary
from warcore.audit.sanitizer import sanitize
from warcore.core import WarcorePluginManager
from warcore.testing import DeclaredBackend, make_plugin_manager

pytestmark = pytest.mark.slow  # 10 runs each; the plugin-matrix cells leave them to the main job

RUNS = 10
TINY: dict[str, Any] = {"requests": 3, "max_running": 2, "num_draft": 2, "model": TINY_MODEL}
"""Three requests, two graph buckets, two draft tokens, a two-layer model: every mode runs, in
a fraction of a second per sanitizer run."""

B = SharedReadBoundary
M = ForwardMode

# What each backend's code does in the reference engine, mode by mode (the read tracer
# agrees: tests/audit/test_tracer.py). EXTEND at IN_REPLAY records nothing (the prefill runner only
# publishes PRE_REPLAY); its early declaration, PRE_REPLAY, does publish.
_CONTRACT = {M.EXTEND: B.IN_REPLAY, M.DECODE: B.IN_REPLAY, M.TARGET_VERIFY: B.IN_REPLAY}
_CONTRACT |= {M.DRAFT_EXTEND_V2: B.IN_REPLAY}


def honest(backend: str, algorithm: str) -> dict[ForwardMode, SharedReadBoundary]:
    table = dict(_CONTRACT)
    if backend in ("trtllm_mha", "deepseek_v4"):
        # The out-graph init snapshots the page table (deepseek_v4: batches that fit its
        # snapshot; it withdraws the others per batch, tests/core/test_war_rules.py).
        table[M.EXTEND] = B.PRE_REPLAY
    if backend == "deepseek_v4" and algorithm != "dspark":
        table[M.TARGET_VERIFY] = B.POST_REPLAY  # re-reads req_to_token in every layer
    return table


# The algorithm under which each mode runs (and publishes).
_RUNS_UNDER = {M.EXTEND: "none", M.DECODE: "none", M.TARGET_VERIFY: "dflash"}
_RUNS_UNDER |= {M.DRAFT_EXTEND_V2: "eagle"}
BACKENDS = ("torch_native", "trtllm_mha", "deepseek_v4")
_PLUGIN = {"torch_native": (), "trtllm_mha": ("trtllm_mha",), "deepseek_v4": ("deepseek_v4",)}


def _needs(backend: str, algorithm: str) -> pytest.MarkDecorator:
    """Skip where the backend's or the algorithm's plugin is not installed."""
    dflash = ("dflash",) if algorithm in ("dflash", "dspark") else ()
    return pytest.mark.plugins(*_PLUGIN[backend], *dflash)


def _earlier(boundary: SharedReadBoundary) -> SharedReadBoundary | None:
    return {B.IN_REPLAY: B.PRE_REPLAY, B.POST_REPLAY: B.IN_REPLAY}.get(boundary)


EARLY_CASES = [
    pytest.param(
        backend,
        mode,
        algorithm,
        marks=pytest.mark.plugins(
            *_PLUGIN[backend], *(("dflash",) if "d" in algorithm[:1] else ())
        ),
        id=f"{backend}-{mode.name}-{algorithm}",
    )
    for backend in BACKENDS
    for mode, default_algorithm in _RUNS_UNDER.items()
    for algorithm in (
        [default_algorithm, "dspark"]
        if backend == "deepseek_v4" and mode is M.TARGET_VERIFY
        else [default_algorithm]
    )
    if _earlier(honest(backend, algorithm)[mode]) is not None
]

HONEST_CASES = [
    pytest.param(
        backend,
        algorithm,
        marks=pytest.mark.plugins(
            *_PLUGIN[backend], *(("dflash",) if "d" in algorithm[:1] else ())
        ),
        id=f"{backend}-{algorithm}",
    )
    for backend in BACKENDS
    for algorithm in ("none", "eagle", "dflash", *(("dspark",) if backend == "deepseek_v4" else ()))
]


def _manager(
    backend: str, declarations: dict[ForwardMode, SharedReadBoundary], algorithm: str
) -> WarcorePluginManager:
    plugin = DeclaredBackend(backend_class(backend), declarations)
    entry_points = ["dflash"] if algorithm in ("dflash", "dspark") else []
    # "algorithms": the core's none/eagle without its own torch_native offer and declarations.
    return make_plugin_manager(plugin, entry_points=entry_points, builtins="algorithms")


def test_the_cases_cover_every_backend_and_mode() -> None:
    ids = {p.id for p in EARLY_CASES}
    # trtllm_mha's and deepseek_v4's EXTEND are PRE_REPLAY already: nothing earlier to make.
    assert len(ids) == 4 + 3 + 4
    assert "trtllm_mha-EXTEND-none" not in ids
    assert "deepseek_v4-EXTEND-none" not in ids
    assert {"deepseek_v4-TARGET_VERIFY-dflash", "deepseek_v4-TARGET_VERIFY-dspark"} <= ids


@pytest.mark.parametrize(("backend", "mode", "algorithm"), EARLY_CASES)
def test_one_step_earlier_is_flagged_every_time(
    backend: str, mode: ForwardMode, algorithm: str
) -> None:
    declarations = honest(backend, algorithm)
    early = _earlier(declarations[mode])
    assert early is not None
    declarations[mode] = early
    pm = _manager(backend, declarations, algorithm)
    flagged = 0
    for _ in range(RUNS):
        report = sanitize(backend, algorithm, pm=pm, **TINY)
        v = report.violation
        assert v is not None, report.format()
        assert (v.kind, v.forward_mode, v.declared) == ("late-read", mode, early), v.describe()
        flagged += 1
    assert flagged == RUNS


@pytest.mark.parametrize(("backend", "algorithm"), HONEST_CASES)
def test_honest_declarations_are_never_flagged(backend: str, algorithm: str) -> None:
    pm = _manager(backend, honest(backend, algorithm), algorithm)
    sound = 0
    for _ in range(RUNS):
        report = sanitize(backend, algorithm, pm=pm, **TINY)
        assert report.sound, report.format()
        assert report.checked > 0  # something published and was poisoned
        sound += 1
    assert sound == RUNS
