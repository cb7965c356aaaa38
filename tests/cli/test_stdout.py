"""Every command, its standard output closed (``warcore plugins >&-``) or full (``warcore
plugins >/dev/full``): one line on stderr naming standard output, exit 2, no traceback
(issue 42). Each runs as a real process with the cheapest arguments that make the command
print its own output (``--help`` would not reach it); the commands come from the CLI's own
table, so a new command without arguments here fails the first test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _support import release_fakes

from warcore.cli import _COMMANDS

pytestmark = pytest.mark.plugin_agnostic  # warcore processes; checks only their own output

CHEAPEST: dict[str, tuple[str, ...]] = {
    "plugins": (),
    "matrix": ("--backend", "torch_native", "--mode", "DECODE", "--algorithm", "none"),
    "check": (),
    "bench": ("lookup", "--number", "1", "--repeat", "1"),
    "run": ("--device", "sim", "--requests", "1", "--no-verify", "--progress", "never"),
    "sanitize": ("--backend", "torch_native", "--algorithm", "none", "--requests", "1")
    + ("--device", "sim", "--no-bindings"),
    "soak": ("--steps", "1", "--requests", "1"),
    "release": (release_fakes.ENGINE, "{wheel}"),
}
"""Per command, arguments that print a report in seconds on a CPU."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fake engine's folder, a wheel of its audited release)."""
    root = tmp_path_factory.mktemp("stdout")
    engines = release_fakes.engine_folder(root / "engines")
    wheel = release_fakes.wheel(
        root, {"wcrel/__init__.py": "", "wcrel/runner.py": release_fakes.AUDITED}
    )
    return engines, wheel


def test_every_command_has_its_cheapest_arguments() -> None:
    assert set(CHEAPEST) == set(_COMMANDS)


def _args(command: str, wheel: Path) -> list[str]:
    return [command, *(a.format(wheel=wheel) for a in CHEAPEST[command])]


@pytest.mark.parametrize("command", sorted(CHEAPEST))
def test_each_command_prints_its_output(
    command: str, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """The control: with a working standard output, the arguments give a report."""
    engines, wheel = setup
    done = release_fakes.run_warcore(engines, tmp_path, *_args(command, wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip()


@pytest.mark.parametrize("command", sorted(CHEAPEST))
def test_a_full_standard_output_is_one_line_and_exit_2(
    command: str, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    engines, wheel = setup
    done = release_fakes.run_warcore(engines, tmp_path, *_args(command, wheel), stdout="full")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1:] == [
        "warcore: error: standard output: No space left on device"
    ]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


@pytest.mark.parametrize("command", sorted(CHEAPEST))
def test_a_closed_standard_output_is_refused_before_the_command_runs(
    command: str, setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """Refused before anything runs: a closed descriptor 1 would be reused by the first file
    the command opens (and inherited by what it starts, ``pip download``)."""
    engines, wheel = setup
    done = release_fakes.run_warcore(engines, tmp_path, *_args(command, wheel), stdout="closed")
    assert done.returncode == 2
    assert done.stderr == (
        "warcore: error: standard output is closed; redirect it to a file or /dev/null instead\n"
    )


def test_an_error_echoing_a_path_with_a_newline_stays_one_line(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    engines, _ = setup
    done = release_fakes.run_warcore(
        engines, tmp_path, "release", release_fakes.ENGINE, "gone\nsecond line\x1b[31m.whl"
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "warcore: error: wctest_rel: gone\\nsecond line\\x1b[31m.whl: no such file\n"
    )
    # argparse's own errors too (through warcore.cli._common.Parser)
    done = release_fakes.run_warcore(engines, tmp_path, "run", "--fence", "fi\nne")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    "args",
    [("bench", "lookup", "--number", "1", "--json"), ("run", "--device", "sim", "--trace")],
    ids=["bench --json", "run --trace"],
)
def test_an_output_file_name_longer_than_the_file_system_allows_is_one_line(
    args: tuple[str, ...], setup: tuple[Path, Path], tmp_path: Path
) -> None:
    engines, _ = setup
    name = str(tmp_path / ("a" * 300 + ".json"))
    done = release_fakes.run_warcore(engines, tmp_path, *args, name)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"warcore: error: {args[-1]} {name}: File name too long\n"


def test_a_logged_error_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    """An engine integration whose import raises an error of two lines: logged in one."""
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "_wcfake_two_lines.py").write_text("raise RuntimeError('first\\nsecond')\n")
    info = engines / "warcore_fake_two_lines-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: warcore-fake-two-lines\n")
    (info / "entry_points.txt").write_text(
        "[warcore.integrations]\nwctest_two = _wcfake_two_lines:ENGINE\n"
    )
    done = release_fakes.run_warcore(engines, tmp_path, "release", "wctest_two", "1.0")
    assert done.returncode == 2
    logged = [line for line in done.stderr.splitlines() if "wctest_two" in line]
    assert logged[0] == (
        "warcore: ERROR: engine integration 'wctest_two' failed to load: "
        "_wcfake_two_lines:ENGINE: RuntimeError: first\\nsecond"
    )
    assert "second" not in done.stderr.replace("first\\nsecond", "")


_PLUGINS_COMMAND = """
import sys
from warcore.cli import run_command

def main():
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
    for n in range(200_000):
        print(n)
    return 3

raise SystemExit(run_command("python -m acme.tool", main))
"""
"""A plugin's own command, its ``__main__`` as warcore-sglang's and warcore-vllm's are."""


@pytest.mark.parametrize(
    ("stdout", "then", "status", "says"),
    [
        ("pipe", "print", 3, None),
        ("full", "print", 2, "error: standard output: No space left on device"),
        (
            "closed",
            "print",
            2,
            "error: standard output is closed; redirect it to a file or /dev/null instead",
        ),
        ("gone", "print", 141, None),
        ("pipe", "interrupt", 130, "SIGINT: stopped; no output file was left half-written"),
    ],
)
def test_a_plugins_command_run_through_run_command_follows_warcores_rules(
    tmp_path: Path, stdout: str, then: str, status: int, says: str | None
) -> None:
    """``run_command``: the command's own exit status; stdout full or closed, one line naming
    the plugin's command, exit 2; the reader gone (``| head -c 1``), quietly 141; Ctrl-C, one
    line and 130; never a traceback."""
    command = [sys.executable, "-c", _PLUGINS_COMMAND, then]
    if stdout == "gone":  # the reader reads one byte and leaves
        script = 'set -o pipefail; "$@" | head -c 1 >/dev/null'
        command = ["bash", "-c", script, "bash", *command]
    done = release_fakes.run_command(
        tmp_path, tmp_path, command, "pipe" if stdout == "gone" else stdout
    )
    assert done.returncode == status, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines == ([f"python -m acme.tool: {says}"] if says else []), lines
    if stdout == "pipe" and then == "print":
        assert done.stdout.split()[-1] == "199999"
