"""The drafter contract is held at its boundary: a wrong draft costs acceptance, never a
request; a drafter or drafter factory that breaks the contract is named, with its plugin, in
one line; a run whose requests failed is never reported identical to the serial loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
import torch

import warcore
from warcore import BackendSpec, ForwardMode
from warcore.attention.torch_native import TorchNativeBackend
from warcore.batch import ForwardBatch
from warcore.cli import main
from warcore.core import WarcorePluginManager, get_registry
from warcore.engine import (
    DrafterError,
    Engine,
    EngineConfig,
    RunReport,
    compare_with_serial,
    synthetic_trace,
)
from warcore.engine.drafter import DraftInput
from warcore.engine.steps import DFLASH_STEP, EAGLE_STEP
from warcore.testing import DeclaredAlgorithm, make_plugin_manager

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

TRACE = {"prompt_len": (4, 10), "output_len": (3, 12)}


def _nan(batch: DraftInput) -> None:
    batch.write(torch.full((batch.batch_size, batch.num_draft), float("nan")))


def _out_of_vocabulary(batch: DraftInput) -> None:
    batch.write(torch.full((batch.batch_size, batch.num_draft), 10**6, dtype=torch.int64))


def _negative_in_place(batch: DraftInput) -> None:
    batch.state.drafts[batch.rows, : batch.num_draft] = -7


def _host_lists(batch: DraftInput) -> None:  # NaN, a huge int, a fraction, infinity
    bad = [float("nan"), 10**30, 2.5, float("inf")]
    batch.write([[bad[(i + j) % 4] for j in range(batch.num_draft)] for i in batch.row_ids])


def _raises(batch: DraftInput) -> None:
    raise RuntimeError("wctest drafter bug")


class BadDrafter:
    """A device drafter that proposes ``how`` at every step."""

    location = "device"

    def __init__(self, how: Callable[[DraftInput], None]) -> None:
        self.how = how

    def admit(self, row: int, request_id: int, prompt: Sequence[int]) -> None:
        pass

    def release(self, row: int) -> None:
        pass

    def propose(self, batch: DraftInput) -> None:
        self.how(batch)


def _algorithm(name: str, factory: Callable[..., Any], step: Any = DFLASH_STEP) -> Any:
    return DeclaredAlgorithm(name, step, drafter=factory, family="dflash")


def _serve(pm: WarcorePluginManager, algorithm: str, requests: int = 8) -> RunReport:
    trace = synthetic_trace(requests, seed=3, **TRACE)
    with Engine(EngineConfig(algorithm=algorithm), device="sim", pm=pm) as engine:
        return engine.run(trace)


def _plain(pm: WarcorePluginManager, requests: int = 8) -> RunReport:
    trace = synthetic_trace(requests, seed=3, **TRACE)
    with Engine(EngineConfig(loop="serial", fence="coarse"), device="sim", pm=pm) as engine:
        return engine.run(trace)


@pytest.mark.parametrize(
    "how", [_nan, _out_of_vocabulary, _negative_in_place, _host_lists], ids=lambda f: f.__name__
)
def test_invalid_drafts_cost_acceptance_never_a_request(how: Callable[[DraftInput], None]) -> None:
    pm = make_plugin_manager(_algorithm("wctest_bad_drafts", lambda *a: BadDrafter(how)))
    report = _serve(pm, "wctest_bad_drafts")
    assert report.errors == {} and report.stopped is None  # was: every request failed in embed
    assert report.outputs == _plain(pm).outputs  # lossless all the same
    plugin = get_registry(pm).algorithms["wctest_bad_drafts"].plugin
    (problem,) = report.drafter_problems
    assert f"algorithm 'wctest_bad_drafts' (plugin {plugin!r})" in problem
    assert "outside the vocabulary (valid: 0..511)" in problem


def test_a_drafter_that_raises_is_isolated_and_named() -> None:
    pm = make_plugin_manager(_algorithm("wctest_raising_drafter", lambda *a: BadDrafter(_raises)))
    report = _serve(pm, "wctest_raising_drafter")
    assert report.errors == {} and report.stopped is None  # was: the stream was poisoned
    assert report.outputs == _plain(pm).outputs
    (problem,) = report.drafter_problems
    assert "algorithm 'wctest_raising_drafter'" in problem
    assert "propose() raised" in problem and "RuntimeError: wctest drafter bug" in problem


def test_warcore_run_reports_the_drafter_and_stays_correct(
    register_for_test: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    register_for_test(_algorithm("wctest_oov_drafter", lambda *a: BadDrafter(_out_of_vocabulary)))
    args = ["run", "--device", "sim", "--algorithm", "wctest_oov_drafter", "--requests", "6"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tokens          identical to the serial loop" in out
    drafter = [line for line in out.splitlines() if line.startswith("  drafter ")]
    assert len(drafter) == 1 and "algorithm 'wctest_oov_drafter' (plugin" in drafter[0], out


def _raising_factory(target: Any, num_draft: int, device: Any) -> Any:
    raise RuntimeError("wctest: no draft weights")


def _none_factory(target: Any, num_draft: int, device: Any) -> Any:
    return None


@pytest.mark.parametrize(
    ("factory", "step", "says"),
    [
        (_raising_factory, DFLASH_STEP, "drafter factory raised RuntimeError: wctest: no draft"),
        (_none_factory, DFLASH_STEP, "drafter factory returned None"),
        (_raising_factory, EAGLE_STEP, "drafter factory raised RuntimeError: wctest: no draft"),
        (_none_factory, EAGLE_STEP, "drafter factory returned None"),
    ],
    ids=["raises", "none", "draft-model-raises", "draft-model-none"],
)
@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
def test_a_broken_drafter_factory_is_one_line_naming_the_algorithm_and_plugin(
    register_for_test: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    factory: Callable[..., Any],
    step: Any,
    says: str,
) -> None:
    plugin = register_for_test(_algorithm("wctest_broken_factory", factory, step))
    pm = make_plugin_manager(plugin)
    name = get_registry(pm).algorithms["wctest_broken_factory"].plugin
    with pytest.raises(DrafterError, match=says):
        Engine(EngineConfig(algorithm="wctest_broken_factory"), device="sim", pm=pm)
    args = ["run", "--device", "sim", "--algorithm", "wctest_broken_factory", "--requests", "2"]
    assert main(args) == 1  # the plugin failed, not the command line
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err  # was: a traceback
    assert lines[0].startswith("warcore: error: algorithm 'wctest_broken_factory' (plugin ")
    assert name.split("-")[0] in lines[0] and says in lines[0]
    assert captured.out == ""


# -- a run with failed requests is never "identical to the serial loop" --------------------


class FailingBackend(TorchNativeBackend):
    """Every prefill raises (a sticky device fault): every request of every run fails. Its
    decode graphs capture fine, so the engine is built."""

    name = "wctest_failing"

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        if batch.forward_mode is ForwardMode.EXTEND:
            raise RuntimeError("wctest: attention kernel fault")
        return super().forward(layer, q, k, v, batch)


class FailingBackendPlugin:
    @warcore.hookimpl
    def warcore_attention_backends(self) -> Iterable[BackendSpec]:
        return [BackendSpec("wctest_failing", FailingBackend, "raises in every forward")]


def test_failed_requests_in_both_loops_are_not_reported_identical(
    register_for_test: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    register_for_test(FailingBackendPlugin())
    args = ["run", "--device", "sim", "--backend", "wctest_failing", "--requests", "3"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "identical" not in out  # was: "identical to the serial loop" (both empty)
    assert "not compared with the serial loop: requests failed (3 in this run, 3 in the serial" in (
        " ".join(out.split())
    )


@pytest.mark.parametrize("failing", ["run", "serial", "both"])
def test_compare_with_serial_refuses_to_compare_failed_runs(failing: str) -> None:
    pm = make_plugin_manager(FailingBackendPlugin())
    trace = synthetic_trace(3, seed=1, **TRACE)
    runs = {}
    for label, backend in (("good", "torch_native"), ("bad", "wctest_failing")):
        with Engine(EngineConfig(backend=backend), device="sim", pm=pm) as engine:
            runs[label] = engine.run(trace)
    assert runs["bad"].errors and not runs["good"].errors
    report = runs["bad" if failing in ("run", "both") else "good"]
    serial = runs["bad" if failing in ("serial", "both") else "good"]
    assert compare_with_serial(report, serial) is None
    assert report.matches_serial is None and report.serial_errors == len(serial.errors)
    from warcore.cli.run import format_report

    text = format_report(report)
    assert "identical" not in text and "DIFFERENT" not in text and "not compared" in text
    # Without failures the comparison is made as before.
    good = runs["good"]
    assert compare_with_serial(good, good) is True
