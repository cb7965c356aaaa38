"""Reports say what happened: sanitize never calls unaudited names sound, the run report's step
breakdown adds up, and a command whose reader goes away exits quietly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import warcore
from warcore import cli
from warcore.audit import sanitizer as sanitizer_module
from warcore.audit.sanitizer import SanitizeReport
from warcore.cli.run import format_report
from warcore.engine import Engine, EngineConfig, synthetic_trace

# what is installed is what these check: every plugin-matrix cell runs them
pytestmark = pytest.mark.installed


class Medusa:
    """An algorithm whose family the reference engine cannot run."""

    @warcore.hookimpl
    def warcore_speculative_algorithms(self) -> list[warcore.AlgorithmSpec]:
        return [
            warcore.AlgorithmSpec("wctest_medusa", "wctest_medusa", "heads on the target (test)")
        ]


def _twin_backend(**kwargs: Any) -> Any:
    from warcore.attention.torch_native import TorchNativeBackend

    return TorchNativeBackend(**kwargs)


class TwinA:
    @warcore.hookimpl
    def warcore_attention_backends(self) -> list[warcore.BackendSpec]:
        return [warcore.BackendSpec("wctest_twin", _twin_backend, "offered twice (test)")]


class TwinB(TwinA):
    pass


@pytest.fixture
def quick_sanitize(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every sanitized combination is sound at once: these tests are about the accounting."""
    ran: list[tuple[str, str]] = []

    def sanitize(backend: str, algorithm: str, **kwargs: Any) -> SanitizeReport:
        ran.append((backend, algorithm))
        report = SanitizeReport(backend, algorithm, kwargs.get("device", "sim"), 1)
        report.forwards = report.checked = 1
        return report

    monkeypatch.setattr(sanitizer_module, "sanitize", sanitize)
    return ran


def _last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_naming_an_algorithm_that_cannot_be_sanitized_is_a_failure(
    clean_env: None,
    register_for_test: Callable[..., Any],
    quick_sanitize: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    register_for_test(Medusa())
    assert cli.main(["sanitize", "--algorithm", "wctest_medusa", "--requests", "1"]) == 1
    last = _last_line(capsys.readouterr().out)
    assert not last.startswith("all sound"), last
    assert "0 combinations sanitized" in last
    assert "algorithm 'wctest_medusa'" in last and "family 'wctest_medusa'" in last
    assert quick_sanitize == []


def test_naming_a_sanitizable_algorithm_stays_a_success(
    clean_env: None, quick_sanitize: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sanitize", "--algorithm", "none", "--backend", "torch_native"]) == 0
    assert _last_line(capsys.readouterr().out) == "all sound: 1 combination sanitized, 0 skipped"


def test_all_says_how_many_were_skipped_and_why_and_fails_on_an_unaudited_name(
    clean_env: None,
    register_for_test: Callable[..., Any],
    quick_sanitize: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warcore.core import get_plugin_manager, get_registry

    register_for_test(Medusa())
    registry = get_registry(get_plugin_manager())
    backends = len(registry.backends)
    assert cli.main(["sanitize", "--all", "--requests", "1"]) == 1
    last = _last_line(capsys.readouterr().out)
    match = re.match(r"(.*): (\d+) combinations? sanitized, (\d+) skipped \((.*)\)", last)
    assert match, last
    assert int(match.group(3)) == backends  # medusa with every backend
    assert f"{backends} not runnable: its family 'wctest_medusa'" in match.group(4)
    assert "algorithm 'wctest_medusa' had no combination sanitized" in last
    assert int(match.group(2)) == len(quick_sanitize) > 0


def test_all_fails_when_a_duplicate_name_left_a_backend_unaudited(
    clean_env: None,
    register_for_test: Callable[..., Any],
    quick_sanitize: list[tuple[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    register_for_test(TwinA())
    register_for_test(TwinB())
    code = cli.main(["sanitize", "--all", "--requests", "1"])
    last = _last_line(capsys.readouterr().out)
    assert code == 1, last
    assert "backend 'wctest_twin' had no combination sanitized" in last
    assert "more than one plugin" in last
    assert all(backend != "wctest_twin" for backend, _ in quick_sanitize)


def test_all_on_the_clean_install_accounts_for_every_name(
    clean_env: None, quick_sanitize: list[tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    from warcore.core import get_plugin_manager, get_registry

    registry = get_registry(get_plugin_manager())
    code = cli.main(["sanitize", "--all", "--requests", "1"])
    last = _last_line(capsys.readouterr().out)
    # Every registered backend and algorithm had a combination sanitized, or it says which not.
    ran_backends = {b for b, _ in quick_sanitize}
    ran_algorithms = {a for _, a in quick_sanitize}
    missing = (set(registry.backends) - ran_backends) | (set(registry.algorithms) - ran_algorithms)
    assert (code == 0) == (not missing), last
    for name in missing:
        assert f"'{name}' had no combination sanitized" in last


# -- the run report ------------------------------------------------------------------------


def _breakdown(report_text: str) -> tuple[int, dict[str, int]]:
    line = next(line for line in report_text.splitlines() if line.strip().startswith("steps"))
    match = re.match(r"\s*steps\s+(\d+) \((.*)\)$", line)
    assert match, line
    parts = {}
    for part in match.group(2).split(", "):
        count, label = part.split(" ", 1)
        parts[label] = int(count)
    return int(match.group(1)), parts


@pytest.mark.plugin_agnostic
@pytest.mark.parametrize("loop", ["overlap", "serial"])
@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_the_step_breakdown_adds_up(loop: str, algorithm: str) -> None:
    # Sparse arrivals: steps with nothing to launch, waiting for the next request.
    trace = synthetic_trace(6, seed=5, output_len=(2, 5), mean_gap_steps=8.0)
    config = EngineConfig(algorithm=algorithm, loop=loop)  # type: ignore[arg-type]
    with Engine(config, device="sim") as engine:
        report = engine.run(trace)
    total, parts = _breakdown(format_report(report))
    assert total == report.steps
    assert sum(parts.values()) == total, parts
    assert parts.get("idle", 0) == report.idle_steps > 0
    assert report.idle_steps + sum(report.forwards.values()) == report.steps


# -- a reader that goes away ---------------------------------------------------------------


@pytest.mark.plugin_agnostic
@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
@pytest.mark.parametrize("command", [["matrix", "--json"], ["matrix"]])
def test_a_closed_pipe_ends_the_command_quietly(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "warcore", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    # The reader goes away before the command writes (it is still importing): its first
    # write meets a closed pipe whatever the output's size (a small plugin set's matrix fits
    # in the pipe's buffer, so reading some of it first would let the command finish).
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
    assert code == 141  # 128 + SIGPIPE, what a shell reports for `cat big | head`
