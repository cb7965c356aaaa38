"""``warcore release`` given any wheel and any argument (issue 42, item 3): each case that
was a traceback (exit 1, which a script reads as "review needed") is one line naming the
culprit and exit 2; memory stays bounded whatever the wheel; a development or local build is
compared only with ``--against``, and said so.

Each case is an exact reproduction, run as a real ``warcore`` process on a wheel built here
(:mod:`_support.release_fakes`: a fake engine relying on two functions of one module).
"""

from __future__ import annotations

import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from _support import release_fakes
from _support.release_fakes import AUDITED, ENGINE

from warcore.integration.wheel import (
    MAX_INDEX_BYTES,
    MAX_MODULE_BYTES,
    MAX_MODULE_TOKENS,
    MAX_SOURCE_BYTES,
)

pytestmark = pytest.mark.plugin_agnostic  # warcore processes; checks only their own output

RUNNER = "wcrel/runner.py"


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return release_fakes.engine_folder(tmp_path_factory.mktemp("hostile") / "engines")


def _good(folder: Path, version: str = "1.0", runner: str = AUDITED) -> Path:
    return release_fakes.wheel(folder, {"wcrel/__init__.py": "", RUNNER: runner}, version)


def _error(done: subprocess.CompletedProcess[str]) -> str:
    """The one line on stderr of a process that exited 2 with nothing on stdout."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("warcore: error: ")
    return line


def test_the_audited_wheel_itself_is_nothing_changed(engines: Path, tmp_path: Path) -> None:
    """The control every hostile wheel below is made from."""
    done = release_fakes.release(engines, tmp_path, ENGINE, _good(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing changed: 1.0 matches its audited entry" in done.stdout


# -- wheels that do not read back as their zip index says -------------------------------------


def _broken_index(folder: Path) -> Path:
    """The central directory's first record signature overwritten (``is_zipfile`` still
    says yes: the end record is intact): ``BadZipFile`` in ``ZipFile()``."""
    path = _good(folder)
    with zipfile.ZipFile(path) as archive:
        start = archive.start_dir
    data = bytearray(path.read_bytes())
    assert data[start : start + 4] == b"PK\x01\x02"
    data[start : start + 4] = b"XX\x01\x02"
    path.write_bytes(bytes(data))
    return path


def _corrupt_data(folder: Path) -> Path:
    """The runner's deflated bytes replaced by ``0xff``: ``zlib.error`` while inflating."""
    path = _good(folder)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(RUNNER)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", data, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    data[start : start + info.compress_size] = b"\xff" * info.compress_size
    path.write_bytes(bytes(data))
    return path


def _encrypted(folder: Path) -> Path:
    return release_fakes.patched(_good(folder), RUNNER, flag_bits=0x1)


def _unknown_method(folder: Path) -> Path:
    return release_fakes.patched(_good(folder), RUNNER, method=99)


_DENSE = AUDITED + "x\n" * 250_000
"""500 kB of bare names, under MAX_MODULE_BYTES: its syntax tree would take about 230 MB."""


def _large_index(folder: Path) -> Path:
    """150 members named by 60,000 characters each: a 9 MB zip index, which zipfile reads
    whole (each record an object: memory grows with it)."""
    names = {f"data/{i:03d}{'x' * 60_000}": "" for i in range(150)}
    return release_fakes.wheel(folder, {"wcrel/__init__.py": "", RUNNER: AUDITED, **names})


def _nested(folder: Path) -> Path:
    """The relied-on module holds 100,000 nested unary minus: the parser's ``MemoryError``."""
    return _good(folder, runner=AUDITED + "\nX = " + "-" * 100_000 + "1\n")


WHEELS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "broken central directory": (
        _broken_index,
        ": not a readable zip archive (Bad magic number for central directory)",
    ),
    "corrupt compressed data": (
        _corrupt_data,
        f": member {RUNNER}: Error -3 while decompressing data",
    ),
    "a zip index over the limit": (
        _large_index,
        f"over the limit of {MAX_INDEX_BYTES:,} (warcore.integration.wheel.MAX_INDEX_BYTES)",
    ),
    "a member marked encrypted": (_encrypted, f": member {RUNNER} is encrypted"),
    "an unknown compression method": (
        _unknown_method,
        f": member {RUNNER} is compressed by method 99, unknown to zipfile",
    ),
    "100,000 nested unary minus": (
        _nested,
        ": module wcrel.runner is nested too deeply for Python's parser (MemoryError)",
    ),
    "a module too dense to parse in bounded memory": (
        lambda folder: _good(folder, runner=_DENSE),
        f": module wcrel.runner holds more than {MAX_MODULE_TOKENS:,} tokens, over the limit "
        "(warcore.integration.wheel.MAX_MODULE_TOKENS)",
    ),
}


@pytest.mark.parametrize("case", WHEELS, ids=str)
def test_a_wheel_that_does_not_read_back_is_one_line_naming_it(
    case: str, engines: Path, tmp_path: Path
) -> None:
    make, expected = WHEELS[case]
    path = make(tmp_path)
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, path))
    assert line.startswith(f"warcore: error: {path}"), line
    assert expected in line, line


# -- memory stays bounded --------------------------------------------------------------------


def _peak_rss(engines: Path, cwd: Path, *args: str | Path) -> tuple[str, int]:
    """(stderr, peak resident memory in bytes) of ``warcore release ARGS``, measured from a
    fresh parent of its own (``RUSAGE_CHILDREN`` holds the largest child it waited for)."""
    measure = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.stderr.write(done.stderr)\n"
    )
    command = [sys.executable, "-c", measure, sys.executable, "-m", "warcore", "release"]
    done = release_fakes.run_command(engines, cwd, [*command, *map(str, args)])
    status, kib = done.stdout.split()
    assert int(status) == 2, done.stderr
    return done.stderr, int(kib) * 1024


_OVERSIZE = MAX_SOURCE_BYTES // MAX_MODULE_BYTES + 1
BOMBS: dict[str, tuple[int, int, str]] = {
    # a 1 MB wheel whose runner inflates to 1 GiB (read whole, it took 2.2 GB)
    "one member of 1 GiB": (
        1024,
        1,
        f"member {RUNNER} is 1,073,741,824 bytes uncompressed, over the limit of "
        f"{MAX_MODULE_BYTES:,} (warcore.integration.wheel.MAX_MODULE_BYTES)",
    ),
    "members within the limit each, over it together": (
        MAX_MODULE_BYTES >> 20,
        _OVERSIZE,
        f"its .py members hold {_OVERSIZE * MAX_MODULE_BYTES:,} bytes uncompressed, over the "
        f"limit of {MAX_SOURCE_BYTES:,} (warcore.integration.wheel.MAX_SOURCE_BYTES)",
    ),
}


@pytest.mark.parametrize("case", BOMBS, ids=str)
def test_a_zip_bomb_is_refused_before_reading_in_bounded_memory(
    case: str, engines: Path, tmp_path: Path
) -> None:
    """Refused from the zip index's sizes, under 256 MB of peak memory."""
    mib, members, expected = BOMBS[case]
    path = release_fakes.bomb(tmp_path, RUNNER, mib, members=members)
    assert path.stat().st_size < 8 << 20
    stderr, peak = _peak_rss(engines, tmp_path, ENGINE, path)
    assert stderr == f"warcore: error: {path}: {expected}\n"
    assert peak < 256 << 20, f"{peak:,} bytes"


def test_a_dense_module_is_refused_before_parsing_in_bounded_memory(
    engines: Path, tmp_path: Path
) -> None:
    path = _good(tmp_path, runner=_DENSE)
    stderr, peak = _peak_rss(engines, tmp_path, ENGINE, path)
    assert "holds more than 200,000 tokens" in stderr and len(stderr.splitlines()) == 1
    assert peak < 128 << 20, f"{peak:,} bytes"


# -- arguments --------------------------------------------------------------------------------


def test_arguments_longer_than_the_file_system_allows_are_one_line(
    engines: Path, tmp_path: Path
) -> None:
    version_10_kb = "0.5." + "1" * 10_000
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, version_10_kb))
    assert line == (
        f"warcore: error: {ENGINE}: {version_10_kb[:80]!r}... (10,004 characters) is neither "
        "a version nor a wheel file (a path ending .whl)"
    )
    long_path = "a" * 296 + ".whl"
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, long_path))
    assert line == f"warcore: error: {ENGINE}: {long_path}: File name too long"


def test_a_300_digit_version_is_asked_of_the_index_and_refused_in_one_line(
    engines: Path, tmp_path: Path
) -> None:
    """A valid version, too long for a file name: pip's own answer (the index lacks it)."""
    digits = "1" * 300
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, digits))
    assert line.startswith(f"warcore: error: {ENGINE} {digits}: pip download fetched no wheel: ")


def test_an_audited_version_that_is_not_a_version_is_one_line(tmp_path: Path) -> None:
    engines = release_fakes.engine_folder(tmp_path / "engines", ("1.0", "one-point-two"))
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, _good(tmp_path)))
    assert line == (
        f"warcore: error: {ENGINE}: the audited entry 'one-point-two' of "
        "_wcfake_release_engine is not a valid version"
    )


# -- a development or local build --------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.0.0.dev0", "1.0+local"])
def test_a_development_or_local_build_is_compared_only_with_against(
    version: str, engines: Path, tmp_path: Path
) -> None:
    path = _good(tmp_path, version)
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, path))
    assert line == (
        f"warcore: error: {ENGINE} {version} is a development or local build: its version says "
        "nothing of its code, so no audited release is nearest; give one with --against "
        "(audited: 1.0)"
    )
    done = release_fakes.release(engines, tmp_path, ENGINE, path, "--against", "1.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].endswith(
        "against the audited 1.0 (a development or local build: compared only as --against asked)"
    )
    # by its version alone: refused before anything is downloaded
    line = _error(release_fakes.release(engines, tmp_path, ENGINE, version))
    assert "is a development or local build" in line
