"""Faults: a forward that raises, a plugin that raises; the scheduler never hangs and nothing
a failure does makes a fence less safe."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from types import FrameType

import pytest
import torch
from _support import fresh_manager

import warcore
from warcore import ForwardMode, RecordPoint, SharedReadBoundary
from warcore.attention.torch_native import TorchNativeBackend
from warcore.batch import ForwardBatch
from warcore.engine import Engine, EngineConfig, EngineFailed, Request, synthetic_trace

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

TRACE = synthetic_trace(24, seed=9, output_len=(2, 12))


@contextmanager
def bounded(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block runs longer than ``seconds``."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s: the engine hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class KernelFault(RuntimeError):
    pass


class FaultyBackend(TorchNativeBackend):
    """Raises in one phase once ``armed`` calls of that phase have passed."""

    name = "wctest_faulty"
    phase = "body"
    armed: int | None = None

    def _tick(self, phase: str) -> None:
        if phase != type(self).phase or type(self).armed is None:
            return
        if type(self).armed == 0:
            raise KernelFault(f"injected fault in the {phase}")
        type(self).armed -= 1

    def init_forward_metadata_out_graph(
        self, batch: ForwardBatch, in_capture: bool = False
    ) -> None:
        self._tick("out_graph")
        super().init_forward_metadata_out_graph(batch, in_capture)

    def init_forward_metadata_in_graph(self, batch: ForwardBatch) -> None:
        self._tick("in_graph")
        super().init_forward_metadata_in_graph(batch)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        if layer == 2:
            self._tick("body")
        return super().forward(layer, q, k, v, batch)


class FaultyPlugin:
    @warcore.hookimpl
    def warcore_attention_backends(self) -> list[warcore.BackendSpec]:
        return [warcore.BackendSpec("wctest_faulty", FaultyBackend, "raises on demand (test)")]


@cache
def expected() -> dict[int, list[int]]:
    """Greedy tokens on sim; CUDA computes the same float64 math, so they agree."""
    with Engine(EngineConfig(loop="serial"), device="sim") as engine:
        return engine.run(TRACE).outputs


@pytest.mark.parametrize("device", ["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("phase", ["out_graph", "in_graph", "body"])
@pytest.mark.parametrize("loop", ["overlap", "serial"])
def test_a_raising_forward_stops_the_engine_cleanly(phase: str, loop: str, device: str) -> None:
    config = EngineConfig(backend="wctest_faulty", loop=loop)  # type: ignore[arg-type]
    with bounded(60), Engine(config, device=device, pm=fresh_manager(FaultyPlugin())) as engine:
        FaultyBackend.phase, FaultyBackend.armed = phase, 25  # after graph capture, mid-run
        try:
            report = engine.run(TRACE)
        finally:
            FaultyBackend.armed = None
        assert report.stopped is not None and f"injected fault in the {phase}" in report.stopped
        assert report.errors, "no request was told about the fault"
        for rid, error in report.errors.items():
            assert error.startswith("engine stopped:") and "KernelFault" in error, rid
        finished = [rid for rid in report.outputs if rid not in report.errors]
        assert finished, "the fault came too early to show that finished requests are kept"
        for rid in finished:
            assert report.outputs[rid] == expected()[rid], rid
        with pytest.raises(EngineFailed, match="sticky"):
            engine.run(TRACE)


def test_an_engine_without_faults_reports_no_stop() -> None:
    with Engine(
        EngineConfig(backend="wctest_faulty"), device="sim", pm=fresh_manager(FaultyPlugin())
    ) as e:
        report = e.run(TRACE)
    assert report.stopped is None and not report.errors
    assert report.outputs == expected()


class RaisingDeclaration:
    @warcore.hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        raise RuntimeError("declaration bug")


@pytest.mark.plugins("trtllm_mha")
def test_a_plugin_raising_at_resolution_means_coarse_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = fresh_manager(RaisingDeclaration())
    config = EngineConfig(backend="trtllm_mha")
    with (
        caplog.at_level(logging.WARNING, logger="warcore.plugins"),
        Engine(config, device="sim", pm=pm) as engine,
    ):
        report = engine.run(TRACE)
        again = engine.run(TRACE)
    assert {point for _, point in report.published} == {RecordPoint.NONE}
    assert report.barriers == {"coarse": sum(report.forwards.values())}
    assert report.outputs == again.outputs == expected()
    lines = [r.getMessage() for r in caplog.records if "declaration bug" in r.getMessage()]
    # Once per resolved (backend, mode, context), however many forwards and runs followed.
    assert lines and len(lines) == len(set(lines))
    assert all("RaisingDeclaration" in line or "treated as UNKNOWN" in line for line in lines)
    assert len(lines) <= 2


def test_requests_that_cannot_fit_fail_alone_naming_the_limit() -> None:
    # Only the bad requests fail: the others are served, the engine keeps running.
    too_long = [Request(100, [1] * 100, 100), Request(101, [1] * 60, 100), *TRACE[:3]]
    with Engine(EngineConfig(), device="sim") as engine:
        report = engine.run(too_long)
    assert set(report.errors) == {100, 101}
    assert "longer than max_prompt 64" in report.errors[100]
    assert "needs 159 KV positions" in report.errors[101] and "at most 128" in report.errors[101]
    assert report.outputs[100] == report.outputs[101] == [] and report.stopped is None
    for req in TRACE[:3]:
        assert report.outputs[req.rid] == expected()[req.rid]
