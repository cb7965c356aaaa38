"""Bad input gets one clear line naming the culprit and a non-zero exit; nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warcore import BoundaryContext, ForwardMode, SharedReadBoundary
from warcore.core import LoaderConfig, UnknownNameError, WarcorePluginManager, get_registry
from warcore.device import get_device
from warcore.engine import EngineConfig

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
        (["run", "--fence", "maybe"], "'maybe'", "fine, coarse, none"),
        (["run", "--loop", "sideways"], "'sideways'", "overlap, serial"),
        (["run", "--dtype", "float8"], "'float8'", "float64"),
        (["run", "--requests", "0"], "--requests", "at least 1"),
        (["run", "--num-draft", "0"], "num_draft", "at least 1"),
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
    pm = WarcorePluginManager(LoaderConfig())
    pm.load_entry_points()
    registry = get_registry(pm)
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
