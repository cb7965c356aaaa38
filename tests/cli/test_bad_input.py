"""Bad input gets one clear line naming the culprit and a non-zero exit; nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from _support import fresh_manager

from warcore import BoundaryContext, ForwardMode, SharedReadBoundary
from warcore.core import UnknownNameError, get_registry
from warcore.device import get_device
from warcore.engine import EngineConfig, Request, synthetic_trace

pytestmark = pytest.mark.plugins()


def _warcore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "warcore", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "culprit", "valid"),
    [
        (["run", "--backend", "nope"], "'nope'", "torch_native"),
        (["run", "--algorithm", "nope"], "'nope'", "dflash"),
        (["run", "--device", "tpu"], "'tpu'", "sim, cuda"),
        (["run", "--fence", "maybe"], "'maybe'", "'fine', 'coarse', 'none'"),
        (["run", "--loop", "sideways"], "'sideways'", "'overlap', 'serial'"),
        (["run", "--dtype", "float8"], "'float8'", "float64"),
        (["run", "--requests", "0"], "--requests", "at least 1"),
        (["run", "--num-draft", "0"], "--num-draft", "at least 1"),
    ],
)
@pytest.mark.slow
def test_bad_run_arguments_are_one_line_and_exit_2(
    args: list[str], culprit: str, valid: str
) -> None:
    result = _warcore(*args, "--requests" if "--requests" not in args else "--seed", "2")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert culprit in lines[0] and valid in lines[0]
    assert result.stdout == ""


def test_unknown_subcommand_and_bad_types_are_usage_errors() -> None:
    assert _warcore("frobnicate").returncode == 2
    result = _warcore("run", "--requests", "many")
    assert result.returncode == 2 and "invalid int value: 'many'" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WARCORE_STRICT_PLUGINS", "maybe"),
        ("WARCORE_FORCE_COARSE", "2"),
        ("WARCORE_PLUGINS", "dflash,../evil"),
        ("WARCORE_DISABLE_PLUGINS", "a b"),
    ],
)
def test_malformed_environment_fails_every_command_naming_the_variable(
    variable: str, value: str
) -> None:
    for command in (["plugins"], ["run", "--requests", "1"]):
        result = _warcore(*command, env={variable: value})
        assert result.returncode == 2, (command, result.stderr)
        assert variable in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_unknown_names_list_the_valid_ones_in_the_api() -> None:
    registry = get_registry(fresh_manager())
    with pytest.raises(UnknownNameError, match=r"unknown backend 'x'; valid: .*torch_native"):
        registry.backend("x")
    with pytest.raises(UnknownNameError, match=r"unknown algorithm 'x'; valid: .*none"):
        registry.algorithm("x")
    with pytest.raises(ValueError, match=r"unknown forward mode 'verify'; valid: .*TARGET_VERIFY"):
        ForwardMode.parse("verify")
    with pytest.raises(ValueError, match=r"unknown shared-read boundary 'late'; valid: .*POST"):
        SharedReadBoundary.parse("late")
    with pytest.raises(ValueError, match=r"unknown device 'gpu'; valid: sim, cuda"):
        get_device("gpu")
    with pytest.raises(ValueError, match="invalid algorithm name 'Bad Name'"):
        BoundaryContext("Bad Name")
    with pytest.raises(ValueError, match="unknown fence 'fast'"):
        EngineConfig(fence="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value", "valid"),
    [
        ("--fence", "fien", "'fine', 'coarse', 'none'"),
        ("--loop", "overlapp", "'overlap', 'serial'"),
        ("--dtype", "float8", "'float64', 'float32', 'float16', 'bfloat16'"),
    ],
)
def test_run_refuses_a_bad_choice_before_torch_is_imported(
    option: str, value: str, valid: str
) -> None:
    """A typo is refused in the time the command line takes to parse, not after torch (and
    the engine) are imported: it was checked when the engine was configured."""
    code = (
        "import sys\nfrom warcore.cli import main\n"
        f"try:\n    status = main(['run', {option!r}, {value!r}])\n"
        "except SystemExit as exit:\n    status = exit.code\n"
        "print(status, 'torch' in sys.modules)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=120
    )
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert option in line and repr(value) in line and valid in line, line
    from warcore.cli.run import FENCE_CHOICES, LOOP_CHOICES
    from warcore.engine import FENCES, LOOPS

    assert (FENCE_CHOICES, LOOP_CHOICES) == (FENCES, LOOPS)  # the parser's are the engine's


# -- limits the engine cannot run past are one line and exit 2 ----------------------------


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return lines[-1]


@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
def test_num_draft_past_what_the_engine_can_capture_names_the_limit() -> None:
    line = _one_line(_warcore("run", "--algorithm", "dflash", "--num-draft", "32"))
    assert len(_warcore("run", "--num-draft", "32").stderr.strip().splitlines()) == 1
    assert "--num-draft" in line and "at most 31" in line and "512-token" in line
    assert EngineConfig().max_num_draft == 31
    with pytest.raises(ValueError, match="at most 31"):
        EngineConfig(num_draft=32)
    # The limit follows the configuration: fewer running requests, wider verifies.
    from warcore.engine import SchedulerConfig

    assert EngineConfig(scheduler=SchedulerConfig(max_running=8)).max_num_draft == 63


@pytest.mark.parametrize("slots", ["2", "8"])
def test_a_small_kv_pool_is_refused_only_for_what_the_options_need(
    slots: str, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--num-slots 2..8 --algorithm none`` was refused blaming ``num_draft 4``, which the user
    never passed and which no speculation uses: without speculation a small pool runs (each
    request that does not fit says so); with it, the line names num_slots and what it needs."""
    from warcore import cli

    run = ["run", "--device", "sim", "--num-slots", slots, "--requests", "2", "--no-verify"]
    assert cli.main([*run, "--algorithm", "none"]) == 1  # the requests that do not fit failed
    plain = capsys.readouterr()
    assert "num_draft" not in plain.err and "per request" in plain.out, plain
    assert cli.main([*run, "--algorithm", "dflash"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"num_slots {slots}" in line and "num_slots >= 10" in line, line
    assert "num_draft 4" in line and "algorithm 'dflash'" in line, line


@pytest.mark.slow
def test_the_widest_num_draft_the_limit_allows_runs() -> None:
    from warcore.engine import Engine

    trace = synthetic_trace(4, seed=1, prompt_len=(4, 8), output_len=(2, 6))
    config = EngineConfig(algorithm="dflash", num_draft=EngineConfig().max_num_draft)
    with Engine(config, device="sim") as engine:
        report = engine.run(trace)
    assert not report.errors and report.stopped is None


@pytest.mark.parametrize("requests", ["100000000", str(10**20), "100001"])
def test_a_trace_past_the_documented_size_is_refused_at_once(requests: str) -> None:
    line = _one_line(_warcore("run", "--requests", requests, "--device", "sim"))
    assert "--requests" in line and "at most 100,000" in line
    with pytest.raises(ValueError, match="100,000"):
        synthetic_trace(int(requests))


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["run"], "--layer-ms"),
        (["run"], "--schedule-ms"),
        (["bench", "overlap"], "--layer-ms"),
        (["bench", "overlap"], "--sched-frac"),
        (["bench", "sweep"], "--layer-ms"),
    ],
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_timing_options_must_be_finite_and_non_negative(
    command: list[str], option: str, value: str
) -> None:
    result = _warcore(*command, f"{option}={value}", "--requests", "1")
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip().splitlines()[-1]  # argparse: usage, then the error
    assert f"argument {option}" in error and repr(value) in error
    assert "finite number >= 0" in error
    assert "Traceback" not in result.stderr


def test_sweep_fractions_must_be_finite() -> None:
    result = _warcore("bench", "sweep", "--fractions", "0,nan")
    assert result.returncode == 2 and "--fractions" in result.stderr


@pytest.mark.parametrize("name", ["schedule_work_s", "modelled_layer_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5])
def test_engine_config_timings_must_be_finite(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("staging_guard", 0, "a bool"),  # it silently turned the guard off
        ("use_graphs", 1, "a bool"),
        ("prefill_staging", "yes", "a bool"),
        ("hicache_deferred_free", None, "a bool"),
        ("num_draft", 2.0, "an int"),
        ("max_prompt", True, "an int"),
        ("event_ring_depth", False, "an int or None"),
        ("schedule_work_s", "0", "a number"),
        ("backend", 3, "a str"),
        ("model", {}, "a ModelConfig"),
        ("flags", [("hicache", True)], "a tuple"),
    ],
)
def test_every_engine_config_field_is_type_checked(name: str, value: object, kind: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} must be {kind}, got ") as info:
        EngineConfig(**{name: value})  # type: ignore[arg-type]
    assert repr(value) in str(info.value)


def test_no_engine_config_field_takes_just_anything() -> None:
    import dataclasses

    for field in dataclasses.fields(EngineConfig):
        with pytest.raises(ValueError, match=field.name):
            EngineConfig(**{field.name: object()})  # type: ignore[arg-type]


def test_soak_needs_at_least_one_request_per_segment() -> None:
    result = _warcore("soak", "--requests", "0", "--steps", "10")
    assert "--requests" in _one_line(result) and "at least 1" in result.stderr
    assert "--steps" in _one_line(_warcore("soak", "--steps", "0"))
    from warcore.audit.soak import soak

    with pytest.raises(ValueError, match="at least 1"):
        soak(10, requests_per_segment=0)


# -- output paths are checked before minutes of measuring ----------------------------------


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every measurement raises: a command that reaches one did not check its paths first."""
    from warcore.bench import lookup, overlap, sanitizer, startup

    called: list[str] = []

    def forbid(name: str) -> object:
        def measure(*args: object, **kwargs: object) -> object:
            called.append(name)
            raise AssertionError(f"{name} measured before checking the output path")

        return measure

    monkeypatch.setattr(lookup, "measure", forbid("lookup"))
    monkeypatch.setattr(overlap, "measure_overlap", forbid("overlap"))
    monkeypatch.setattr(overlap, "measure_sweep", forbid("sweep"))
    monkeypatch.setattr(startup, "measure", forbid("startup"))
    monkeypatch.setattr(sanitizer, "measure", forbid("sanitizer"))
    from warcore.engine.engine import Engine

    monkeypatch.setattr(Engine, "__init__", forbid("run"))  # warcore run --trace
    for var in [v for v in os.environ if v.startswith("WARCORE_")]:
        monkeypatch.delenv(var)
    return called


def _bad_paths(tmp_path: Path) -> dict[str, str]:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    return {
        "a directory": str(tmp_path),
        "under a file": str(a_file / "out.json"),
        # Root passes os.access() here, then cannot create the file: found by trying (issue 27).
        "in /proc": "/proc/warcore-out.json",
        "a new folder in /proc": "/proc/warcore-new/out.json",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "lookup", "--json", "{}"],
        ["bench", "overlap", "--json", "{}"],
        ["bench", "sweep", "--json", "{}"],
        ["bench", "sweep", "--plot", "{}"],
        ["bench", "startup", "--json", "{}"],
        ["bench", "sanitizer", "--json", "{}"],
        ["bench", "all", "--plot", "{}"],
        ["run", "--requests", "1", "--device", "sim", "--trace", "{}"],
    ],
)
def test_an_unwritable_output_path_fails_before_measuring(
    argv: list[str],
    tmp_path: Path,
    no_measuring: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from warcore import cli
    from warcore.bench import plot

    monkeypatch.setattr(plot, "missing_matplotlib", lambda: None)  # not what is tested here
    for what, path in _bad_paths(tmp_path).items():
        code = cli.main([a.replace("{}", path) for a in argv])
        err = capsys.readouterr().err
        assert code == 2, (what, err)
        assert path in err and len(err.strip().splitlines()) == 1, (what, err)
    assert no_measuring == []


def test_an_output_that_fails_while_written_is_one_line_naming_it(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``/dev/full`` can be opened, so no check before the run can refuse it: the write fails
    with one line naming the path (it was an OSError traceback)."""
    from warcore import cli

    code = cli.main(["bench", "lookup", "--number", "1", "--repeat", "1", "--json", "/dev/full"])
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert "--json /dev/full" in line and "No space left on device" in line, line


def test_trace_creates_missing_folders(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As docs/cli.md says (it was refused: "folder ... does not exist")."""
    import json

    from warcore import cli

    trace = tmp_path / "new" / "deeper" / "run.json"
    argv = ["run", "--requests", "1", "--device", "sim", "--no-verify", "--trace", str(trace)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    assert sorted(p.name for p in trace.parent.iterdir()) == ["run.json"]  # no temporary left


def test_the_writability_check_leaves_nothing_behind(tmp_path: Path) -> None:
    """It tries for real (create, then remove), and removes the folders it made to try."""
    from warcore.cli._common import check_writable

    kept = tmp_path / "kept.json"
    kept.write_text("before")
    check_writable("--json", kept)
    check_writable("--json", tmp_path / "a" / "b" / "out.json", make_parents=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    assert kept.read_text() == "before"


# -- the Python API: only the bad request fails --------------------------------------------


@cache
def _clean_outputs() -> dict[int, list[int]]:
    from warcore.engine import Engine

    with Engine(EngineConfig(), device="sim") as engine:
        return engine.run(_TRACE).outputs


_TRACE = synthetic_trace(6, seed=3, output_len=(2, 6))


@pytest.mark.parametrize(
    ("token", "words"),
    [
        (512, ["512", "vocab_size 512", "0..511"]),
        (-1, ["-1", "vocab_size 512"]),
        (10**6, ["1000000"]),
        (1.5, ["1.5", "not an integer"]),
    ],
)
def test_a_bad_token_id_fails_only_its_request(token: object, words: list[str]) -> None:
    from warcore.engine import Engine

    bad = Request(99, [3, 4, token, 5], 4)  # type: ignore[list-item]
    with Engine(EngineConfig(), device="sim") as engine:
        report = engine.run([*_TRACE, bad])
        assert report.stopped is None
        assert set(report.errors) == {99}
        for word in words:
            assert word in report.errors[99], report.errors[99]
        assert report.outputs[99] == []
        from warcore.cli.run import format_report

        assert f"request 99: {report.errors[99]}" in format_report(report)
        assert {rid: out for rid, out in report.outputs.items() if rid != 99} == _clean_outputs()
        # The engine is not stopped: it serves the next run.
        assert engine.run(_TRACE).outputs == _clean_outputs()


def test_a_prompt_past_max_prompt_fails_only_its_request() -> None:
    from warcore.engine import Engine

    long = Request(77, [1] * 65, 2)
    with Engine(EngineConfig(), device="sim") as engine:
        report = engine.run([*_TRACE, long])
    assert set(report.errors) == {77} and "max_prompt 64" in report.errors[77]
    assert {rid: out for rid, out in report.outputs.items() if rid != 77} == _clean_outputs()


def test_duplicate_request_ids_are_refused_before_anything_runs() -> None:
    from warcore.engine import Engine

    twice = [*_TRACE, Request(_TRACE[2].rid, [1, 2, 3], 3)]
    with Engine(EngineConfig(), device="sim") as engine:
        with pytest.raises(ValueError, match=rf"duplicate request id {_TRACE[2].rid}\b"):
            engine.run(twice)
        assert engine.run(_TRACE).outputs == _clean_outputs()  # nothing ran, nothing broke


@pytest.mark.parametrize("context", ["eagle", {"algorithm": "eagle"}])
def test_a_context_that_is_not_a_boundary_context_is_named(context: object) -> None:
    from warcore import resolve_shared_read_boundary

    with pytest.raises(TypeError, match="context must be a warcore.BoundaryContext"):
        resolve_shared_read_boundary("torch_native", "DECODE", context)  # type: ignore[arg-type]


def test_a_wrapper_backend_that_is_its_own_child_is_named_and_coarse() -> None:
    from warcore import resolve_shared_read_boundary
    from warcore.attention.torch_native import TorchNativeBackend

    class SelfWrapping(TorchNativeBackend):
        name = "wctest_self_wrapping"

        def __init__(self) -> None:  # no pool needed: only resolved, never run
            pass

        def children(self) -> tuple[TorchNativeBackend, ...]:
            return (self,)

    # Issue 17: not an error that breaks the tools, the coarse fence naming the cycle.
    resolved = resolve_shared_read_boundary(SelfWrapping(), "DECODE")
    assert resolved.source == "default:failed:backend:wctest_self_wrapping"
    assert "cycle: wctest_self_wrapping -> wctest_self_wrapping" in resolved.failures[0].error


def test_latest_of_a_string_names_the_string() -> None:
    from warcore import latest

    with pytest.raises(TypeError, match="'PRE_REPLAY'"):
        latest("PRE_REPLAY")  # type: ignore[arg-type]


# -- a fault during construction leaks nothing ---------------------------------------------


class _CaptureFault(RuntimeError):
    pass


def test_a_fault_during_graph_capture_releases_the_device_and_the_cache() -> None:
    import gc
    import threading

    import warcore
    from warcore.attention.torch_native import TorchNativeBackend
    from warcore.core import get_decision_cache
    from warcore.device import DeviceError
    from warcore.engine import Engine

    class CaptureFaulty(TorchNativeBackend):
        name = "wctest_capture_faulty"

        def init_forward_metadata_in_graph(self, batch: object) -> None:
            raise _CaptureFault("injected fault in the in-graph init")

    class Plugin:
        @warcore.hookimpl
        def warcore_attention_backends(self) -> list[warcore.BackendSpec]:
            return [
                warcore.BackendSpec("wctest_capture_faulty", CaptureFaulty, "raises at capture")
            ]

    pm = fresh_manager(("wctest_capture_faulty_plugin", Plugin()))
    cache = get_decision_cache(pm)
    gc.collect()
    threads, entries = threading.active_count(), len(cache)
    for _ in range(20):
        with pytest.raises(DeviceError, match="injected fault"):
            Engine(EngineConfig(backend="wctest_capture_faulty"), device="sim", pm=pm)
    gc.collect()
    assert threading.active_count() == threads
    assert len(cache) == entries
    alive = [o for o in gc.get_objects() if isinstance(o, CaptureFaulty)]
    assert alive == []
