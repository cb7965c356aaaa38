"""Command-line input: one line naming the culprit and exit 2, the same from every command,
refused while parsing — before torch is imported or anything is built."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time

import pytest
from _support import ROOT
from _support.fake_dists import run_warcore

from warcore import cli

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

# Every command that takes --flag, with the arguments it needs to get as far as running.
FLAG_COMMANDS = {
    "matrix": ["matrix"],
    "run": ["run", "--requests", "1", "--no-verify"],
    "sanitize": ["sanitize", "--all", "--requests", "1"],
}


def _main(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, list[str], str]:
    status = cli.main(args)
    captured = capsys.readouterr()
    return status, captured.err.strip().splitlines(), captured.out


@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        (["layer_hybrid_backends=layer_hybrid"], "backend 'layer_hybrid' cannot be its own child"),
        (["hybrid_decode_backend=hybrid"], "backend 'hybrid' cannot be its own child"),
        (["hybrid_prefill_backend=hybrid"], "backend 'hybrid' cannot be its own child"),
        # Each wrapper the other's child: a cycle through both (run recursed until Python
        # gave up, before).
        (
            ["hybrid_decode_backend=layer_hybrid", "layer_hybrid_backends=torch_native,hybrid"],
            "cannot be its own child",
        ),
        (["hybrid_decode_backend=nosuch"], "unknown backend 'nosuch'"),
        (["layer_hybrid_backends=,"], "names no backend"),
    ],
)
@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
def test_bad_wrapper_children_are_one_line_and_exit_2_from_every_command(
    capsys: pytest.CaptureFixture[str], flags: list[str], culprit: str
) -> None:
    seen = {}
    for command, args in FLAG_COMMANDS.items():
        argv = [*args, "--backend", "hybrid"] if command == "run" else list(args)
        for flag in flags:
            argv += ["--flag", flag]
        status, err, out = _main(capsys, argv)
        assert status == 2, (command, err, out)
        assert len(err) == 1 and culprit in err[0], (command, err)
        assert err[0].startswith("warcore: error: ")
        assert out == "", command  # nothing measured, nothing printed
        seen[command] = err[0]
    assert len(set(seen.values())) == 1, seen  # the same words from all three


def test_a_flag_cycle_names_the_flags_on_the_way() -> None:
    from warcore.attention.composite import check_child_flags
    from warcore.core import get_plugin_manager, get_registry

    lookup = get_registry(get_plugin_manager()).backend
    flags = {"hybrid_decode_backend": "layer_hybrid", "layer_hybrid_backends": "hybrid"}
    with pytest.raises(ValueError, match="cannot be its own child") as info:
        check_child_flags(flags, lookup)
    assert "hybrid_decode_backend" in str(info.value)
    assert "layer_hybrid_backends" in str(info.value)
    check_child_flags({"hybrid_decode_backend": "layer_hybrid"}, lookup)  # no cycle: fine
    check_child_flags({}, lookup)  # the defaults


def _warcore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    return run_warcore(*args, env={**clean, **(env or {})})


# -- every numeric option has a documented upper limit, refused while parsing -------------


def _numeric_options() -> list[tuple[str, str, object, str]]:
    """(command, option, argparse type, help) of every option of every command that has a
    type (the others are flags, names, paths or choices)."""
    import argparse

    def walk(
        parser: argparse.ArgumentParser, path: list[str]
    ) -> list[tuple[str, str, object, str]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, [*path, name])
            elif action.type is not None:
                option = action.option_strings[-1]
                found.append((" ".join(path), option, action.type, action.help or ""))
        return found

    return walk(cli._build_parser(), [])


def _too_big(kind: object) -> str:
    from warcore.cli._common import Limit

    assert isinstance(kind, Limit)
    return str(int(kind.most) + 1) if kind.kind is int else "1e308"


def test_every_numeric_option_has_a_limit_refused_while_parsing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warcore.cli._common import FRACTION, Limit

    options = _numeric_options()
    assert len(options) > 20  # every command's, bench's subcommands included
    for command, option, kind, text in options:
        if option == "--fractions":  # a comma list of FRACTIONs
            kind, value = FRACTION, "0,1e308"
        else:
            assert isinstance(kind, Limit), f"{command} {option}: numeric without a limit"
            value = _too_big(kind)
        assert math.isfinite(kind.most)
        with pytest.raises(SystemExit) as info:
            cli._build_parser().parse_args([*command.split(), option, value])
        assert info.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {option}" in error and repr(value.split(",")[-1]) in error, error
        assert "at most" in error, error
        assert kind.range in text, (command, option, text)  # --help says it


@pytest.mark.parametrize("typo", ["1_0", " 1", "1 ", "\u0661", "0x1", "1,5", "+-1", "1e", ""])
def test_a_float_option_takes_plain_decimal_numbers_only(
    typo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``float()`` takes ``1_0``, spaces and other scripts' digits: typos, as for an int."""
    from warcore.cli._common import Limit

    floats = [(c, o) for c, o, kind, _ in _numeric_options() if getattr(kind, "kind", 0) is float]
    assert len(floats) >= 4, floats  # run's and bench's modelled times and fractions
    for command, option in floats:
        with pytest.raises(SystemExit) as info:
            cli._build_parser().parse_args([*command.split(), option, typo])
        assert info.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {option}" in error and "invalid float value" in error, error
    for plain in ("2", "0.5", ".5", "5.", "1e-3", "1E2"):
        assert Limit(float, 0.0, 1e3)(plain) == float(plain)


def _documented_limits() -> dict[tuple[str, str], str]:
    """(command, option) -> range, from the table of numeric limits on the CLI's docs page."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table: dict[tuple[str, str], str] = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`--"):
            continue
        options = re.findall(r"`(--[a-z-]+)`", cells[0])
        commands = re.findall(r"`([a-z ]+)`", cells[1])
        for option in options:
            for command in commands:
                table[(command, option)] = cells[2]
    return table


def test_the_docs_state_every_numeric_limit() -> None:
    from warcore.cli._common import FRACTION

    documented = _documented_limits()
    actual = {
        (command, option): (FRACTION if option == "--fractions" else kind).range  # type: ignore[attr-defined]
        for command, option, kind, _ in _numeric_options()
    }
    assert documented == actual


def test_the_parser_limits_are_the_engines() -> None:
    from warcore.cli._common import REQUESTS
    from warcore.cli.run import DEFAULT_NUM_SLOTS, NUM_DRAFT
    from warcore.engine import MAX_TRACE_REQUESTS, EngineConfig

    assert REQUESTS.most == MAX_TRACE_REQUESTS
    assert NUM_DRAFT.most == EngineConfig().max_num_draft
    assert EngineConfig().num_slots == DEFAULT_NUM_SLOTS


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["run", "--layer-ms", "1e308"], "--layer-ms"),  # was: OverflowError mid-run
        (["run", "--schedule-ms", "1e300"], "--schedule-ms"),
        (["soak", "--steps", "999999999999"], "--steps"),  # was: accepted, and ran
        (["bench", "lookup", "--number", "10000000000"], "--number"),
    ],
)
def test_huge_numbers_are_one_line_and_exit_2_before_anything_runs(
    args: list[str], option: str
) -> None:
    start = time.perf_counter()
    result = _warcore(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    error = result.stderr.strip().splitlines()[-1]
    assert f"argument {option}" in error and "at most" in error, error
    assert time.perf_counter() - start < 30  # refused, not run (a soak step takes ~60 ms)


# -- a disabled backend is named as disabled, before torch is imported ---------------------


@pytest.mark.plugins("trtllm_mha")
@pytest.mark.clean_install
def test_a_disabled_backend_says_so_and_which_variable_before_torch_is_imported() -> None:
    probe = (
        "import sys\n"
        "from warcore import cli\n"
        "status = cli.main(sys.argv[1:])\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
        "sys.exit(status)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    env["WARCORE_DISABLE_PLUGINS"] = "trtllm_mha"
    result = subprocess.run(
        [sys.executable, "-c", probe, "run", "--backend", "trtllm_mha", "--requests", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "backend 'trtllm_mha' is disabled" in lines[0]
    assert "WARCORE_DISABLE_PLUGINS" in lines[0] and "warcore-trtllm-mha" in lines[0]
    assert result.stdout.strip() == "torch not imported"  # refused before the engine


@pytest.mark.plugins("trtllm_mha")
def test_a_backend_left_out_of_the_allowlist_says_so() -> None:
    env = {"WARCORE_PLUGINS": "dflash"}
    result = _warcore("run", "--backend", "trtllm_mha", "--requests", "2", env=env)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "backend 'trtllm_mha' is disabled" in line and "WARCORE_PLUGINS" in line, line
    # A name no plugin of that name would offer: unknown, listing who was not asked.
    env = {"WARCORE_DISABLE_PLUGINS": "trtllm_mha"}
    result = _warcore("sanitize", "--backend", "nope", env=env)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "unknown backend 'nope'" in line, result.stderr
    assert "'trtllm_mha'" in line and "WARCORE_DISABLE_PLUGINS" in line, line


def test_a_str_flag_keeps_its_text_and_a_child_must_be_a_backend(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from warcore.cli._common import parse_flag

    assert parse_flag("hybrid_decode_backend=1") == ("hybrid_decode_backend", "1")  # not int 1
    status, err, _ = _main(capsys, ["matrix", "--flag", "hybrid_decode_backend=1"])
    assert status == 2 and "unknown backend '1'" in err[0]


def test_modelled_time_is_bounded_in_the_engine_too() -> None:
    from warcore.cli._common import MILLISECONDS
    from warcore.engine import EngineConfig
    from warcore.engine.config import MAX_MODELLED_S

    assert MILLISECONDS.most == MAX_MODELLED_S * 1e3  # the CLI's limit is the engine's
    for name in ("modelled_layer_s", "schedule_work_s"):
        with pytest.raises(ValueError, match=f"{name} must be at most 1 s"):
            EngineConfig(**{name: 1e306})  # type: ignore[arg-type]
        EngineConfig(**{name: MAX_MODELLED_S})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["bench", "overlap", "--backend", "nope"], "unknown backend 'nope'"),
        (["bench", "sweep", "--backend", "nope"], "unknown backend 'nope'"),
        (["bench", "overlap", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    ],
)
def test_bench_names_are_checked_before_measuring(args: list[str], culprit: str) -> None:
    result = _warcore(*args, "--requests", "1", "--repeat", "1", "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr  # was: a traceback
    assert "Traceback" not in result.stderr and culprit in result.stderr.strip().splitlines()[-1]
