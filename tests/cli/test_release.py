"""``warcore release`` on the real wheels: sglang 0.5.21, 0.5.22 and 0.5.23 and vLLM 0.33.0 and
0.34.0, fetched from the package index with ``pip download --no-deps`` once per session (and
by the command itself where a test gives a version).

Each audited release matches its own entry (which checks the data modules' digests and
structural checks against the real source); the differences the command reports are those
SGLANG-RELEASES §2 and VLLM-0.34 §1.2 list, written here by hand; the draft entry it prints,
applied with ``derive``, is the table ``engine_code.audit_in_source`` computes from the
wheel's own files (read here with :mod:`zipfile`). Bad input is one line, exit 2, and leaves
no temporary folder behind.

The engines come through the entry-point group ``warcore.integrations`` as warcore-sglang's
and warcore-vllm's ``pyproject.toml`` declare it: a ``.dist-info`` per plugin, on the
subprocess's path before site-packages, so the test does not depend on whether the plugins
are installed (the main job does not install them) and an installed copy is shadowed.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from warcore.integration.engine_code import audit_in_source
from warcore.integration.releases import Release

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

# runs warcore processes that see the installed environment, but reads only the
# warcore.integrations entry points this file puts first on their path
pytestmark = pytest.mark.plugin_agnostic

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = {"sglang": ROOT / "plugins" / "sglang", "vllm": ROOT / "plugins" / "vllm"}
S = "sglang.srt."
BASE_ATTN = S + "layers.attention.base_attn_backend"
PUBLISHER = S + "model_executor.runner_utils.shared_read_event"
DECODE_RUNNER = S + "model_executor.runner.decode_cuda_graph_runner"
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"


# -- the wheels, the engines' entry points, the command -----------------------------------------


def _pip_download(distribution: str, version: str, folder: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += [
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(folder),
        f"{distribution}=={version}",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


WANTED = [
    ("sglang", "0.5.21"),
    ("sglang", "0.5.22"),
    ("sglang", "0.5.23"),
    ("vllm", "0.33.0"),
    ("vllm", "0.34.0"),
]


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """The five wheels, downloaded from the index at once (several seconds: ~700 MB)."""
    folder = tmp_path_factory.mktemp("wheels")
    started = {wanted: _pip_download(*wanted, folder / "-".join(wanted)) for wanted in WANTED}
    found: dict[tuple[str, str], Path] = {}
    for (distribution, version), process in started.items():
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, stderr.decode()
        (path,) = (folder / f"{distribution}-{version}").glob("*.whl")
        found[distribution, version] = path
    return found


def _dist_info(root: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"{key} = {value}" for key, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[warcore.integrations]\n" + "\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder exposing the plugins' warcore.integrations entry points as declared."""
    root = tmp_path_factory.mktemp("engines")
    for tree in PLUGINS.values():
        project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
        group = project["entry-points"]["warcore.integrations"]
        _dist_info(root, project["name"], project["version"], group)
    return root


@dataclass(frozen=True)
class Result:
    status: int
    stdout: str
    stderr: str
    left_in_tmp: list[str]


class Running:
    """``python -m warcore release ARGS`` started, seeing the engines (and the folders of
    ``path`` before them), with an empty TMPDIR of its own in ``folder``."""

    def __init__(
        self, engines: Path, folder: Path, *args: str | Path, path: tuple[Path, ...] = ()
    ) -> None:
        self.tmp = folder / f"tmpdir-{len(list(folder.glob('tmpdir-*')))}"
        self.tmp.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
        python_path = [*path, engines, *PLUGINS.values()]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, python_path), env.get("PYTHONPATH", "")])
        env["TMPDIR"] = str(self.tmp)
        command = [sys.executable, "-m", "warcore", "release", *map(str, args)]
        self.process = subprocess.Popen(
            command, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def result(self) -> Result:
        try:
            stdout, stderr = self.process.communicate(timeout=600)
        finally:
            self.process.kill()
        left = sorted(p.name for p in self.tmp.iterdir())
        return Result(self.process.returncode, stdout, stderr, left)


def release(engines: Path, folder: Path, *args: str | Path, path: tuple[Path, ...] = ()) -> Result:
    return Running(engines, folder, *args, path=path).result()


@pytest.fixture(scope="session")
def runs(
    wheels: dict[tuple[str, str], Path], engines: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Result]:
    """The commands on the real wheels, run side by side (each reads a whole wheel)."""
    folder = tmp_path_factory.mktemp("runs")
    commands: dict[str, tuple[str | Path, ...]] = {
        f"{engine} {version}": (engine, wheels[engine, version]) for engine, version in WANTED
    }
    commands["sglang 0.5.21 --against 0.5.23"] = (
        "sglang",
        wheels["sglang", "0.5.21"],
        "--against",
        "0.5.23",
    )
    commands["vllm 0.34.0 --against 0.33.0"] = (
        "vllm",
        wheels["vllm", "0.34.0"],
        "--against",
        "0.33.0",
    )
    # by its version: the command fetches it itself
    commands["fetch sglang 0.5.22 --against 0.5.23"] = ("sglang", "0.5.22", "--against", "0.5.23")
    started = {name: Running(engines, folder, *args) for name, args in commands.items()}
    return {name: running.result() for name, running in started.items()}


STATUSES = ("signature changed", "body changed", "unchanged", "moved", "gone")


def function_rows(report: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, qualname) -> (status, detail), read from the report's functions section."""
    section = report.split("relied-on functions:", 1)[1].split("\n\n", 1)[0]
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    module = ""
    for line in section.splitlines()[1:]:
        if not line.startswith("    "):
            module = line.strip()
            continue
        status = next(s for s in STATUSES if line.strip().startswith(s))
        qualname, _, detail = line.strip()[len(status) :].strip().partition(" ")
        rows[module, qualname] = (status, detail.strip())
    return rows


def draft_of(report: str) -> str:
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if ".derive(" in line and line.startswith("_"))
    end = lines.index(")", start)
    return "\n".join(lines[start : end + 1])


@pytest.fixture(scope="session")
def data() -> Iterator[dict[str, ModuleType]]:
    """The engines' data modules, imported from the plugins' trees (pure data). The trees
    leave ``sys.path`` at once: an editable install's ``*.egg-info`` there would make the
    plugins' entry points look installed to every later test of the session."""
    sys.path[:0] = [str(tree) for tree in PLUGINS.values()]
    try:
        modules = {
            name: importlib.import_module(f"warcore_{name}.releases") for name in ("sglang", "vllm")
        }
    finally:
        for tree in PLUGINS.values():
            sys.path.remove(str(tree))
    yield modules


def table_in_wheel(wheel: Path, base: Release) -> dict[str, dict[str, tuple[str, str]]]:
    """``base``'s rows as this wheel's own sources give them (``audit_in_source`` on the
    module files read from the zip; a row whose function is absent dropped; a signature-only
    row stays one)."""
    table: dict[str, dict[str, tuple[str, str]]] = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for module, rows in base.functions.items():
            path = module.replace(".", "/") + ".py"
            source = archive.read(path).decode() if path in names else None
            for qualname, (_, audited_digest) in rows.items():
                try:
                    signature, digest = audit_in_source(source or "", qualname)
                except LookupError:
                    continue
                table.setdefault(module, {})[qualname] = (
                    signature,
                    digest if audited_digest else "",
                )
    return table


# -- every audited release matches its own entry ---------------------------------------------


@pytest.mark.parametrize("wanted", WANTED, ids="-".join)
def test_each_audited_release_matches_its_own_entry(
    wanted: tuple[str, str], wheels: dict[tuple[str, str], Path], runs: dict[str, Result]
) -> None:
    engine, version = wanted
    result = runs[f"{engine} {version}"]
    assert result.status == 0, result.stdout + result.stderr
    assert f"{engine} {version} ({wheels[wanted].name}, sha256 " in result.stdout
    assert f"against the audited {version}" in result.stdout  # the nearest: itself
    assert f"nothing changed: {version} matches its audited entry" in result.stdout
    assert ".derive(" not in result.stdout and result.stderr == ""
    statuses = {status for status, _ in function_rows(result.stdout).values()}
    assert statuses == {"unchanged"}


# -- sglang 0.5.22 and 0.5.21 against 0.5.23 (SGLANG-RELEASES §2) --------------------------------

_GONE_SINCE_0_5_23 = {
    (BASE_ATTN, "AttentionBackend.resolve_prefill_shared_read_ends"),
    (BASE_ATTN, "AttentionBackend._snapshot_prefill_shared_reads"),
}
_PUBLISHER = (PUBLISHER, "maybe_publish_prefill_shared_read_done")
_RESOLVE = (DECODE_RUNNER, "DecodeCudaGraphRunner._resolve_shared_read_ends")


@pytest.fixture
def sglang_0_5_22(runs: dict[str, Result]) -> Result:
    """``warcore release sglang 0.5.22 --against 0.5.23``: the command fetches it itself."""
    return runs["fetch sglang 0.5.22 --against 0.5.23"]


def _expect_against_0_5_23(
    rows: dict[tuple[str, str], tuple[str, str]],
) -> dict[str, set[tuple[str, str]]]:
    by_status: dict[str, set[tuple[str, str]]] = {}
    for key, (status, _) in rows.items():
        by_status.setdefault(status, set()).add(key)
    assert len(rows) == 20  # 0.5.23's table
    assert by_status["gone"] == _GONE_SINCE_0_5_23
    assert by_status["signature changed"] == {_PUBLISHER}
    assert rows[_PUBLISHER][1] == (
        "(model_runner, shared_read_ends, device_module) -> "
        "(model_runner, forward_batch, device_module)"
    )
    return by_status


def test_sglang_0_5_22_against_0_5_23_reports_two_gone_and_one_signature(
    sglang_0_5_22: Result,
) -> None:
    assert sglang_0_5_22.status == 1, sglang_0_5_22.stdout + sglang_0_5_22.stderr
    assert "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl" in sglang_0_5_22.stdout
    by_status = _expect_against_0_5_23(function_rows(sglang_0_5_22.stdout))
    assert len(by_status["unchanged"]) == 17 and set(by_status) == {
        "unchanged",
        "gone",
        "signature changed",
    }
    assert "watched modules: 11, every one in this wheel" in sglang_0_5_22.stdout
    assert "structural checks: 8, 0 failing" in sglang_0_5_22.stdout
    assert sglang_0_5_22.left_in_tmp == []  # the download folder is gone


def test_the_fetched_draft_applied_with_derive_is_the_wheels_table(
    sglang_0_5_22: Result, wheels: dict[tuple[str, str], Path], data: dict[str, ModuleType]
) -> None:
    releases = data["sglang"].RELEASES
    namespace: dict[str, object] = {"_0_5_23": releases["0.5.23"]}
    exec(draft_of(sglang_0_5_22.stdout), namespace)
    drafted = namespace["_0_5_22"]
    assert isinstance(drafted, Release) and drafted.version == "0.5.22"
    expected = table_in_wheel(wheels["sglang", "0.5.22"], releases["0.5.23"])
    assert drafted.functions == expected
    # the publisher's 0.5.22 row, as SGLANG-RELEASES §2 gives it and the 0.5.22 entry has it
    row = ("(model_runner, forward_batch, device_module)", "3832563ab932ec8e")
    assert drafted.functions[PUBLISHER]["maybe_publish_prefill_shared_read_done"] == row
    for module, rows in drafted.functions.items():  # every drafted row is the audited 0.5.22's
        assert {q: releases["0.5.22"].functions[module][q] for q in rows} == rows
    assert "drafted by warcore release on" in str(drafted.evidence)
    assert "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl (sha256 " in str(drafted.evidence)


def test_sglang_0_5_21_against_0_5_23_also_reports_the_decode_runners_body(
    runs: dict[str, Result],
) -> None:
    result = runs["sglang 0.5.21 --against 0.5.23"]
    assert result.status == 1
    rows = function_rows(result.stdout)
    by_status = _expect_against_0_5_23(rows)
    assert by_status["body changed"] == {_RESOLVE} and len(by_status["unchanged"]) == 16
    assert rows[_RESOLVE][1] == "digest 0092106b1a2a2ffe -> c0d11a79285939e0"


# -- vLLM 0.34.0 against 0.33.0 (VLLM-0.34 §1.2) -----------------------------------------------


V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
BUFFERS = "vllm.v1.worker.gpu.buffer_utils"
WARMUP = "vllm.v1.worker.gpu.warmup"
_CHANGED_SINCE_0_33_0 = {
    # VLLM-0.34 §1.1-§1.2 and §3.2, digests as the 0.34.0 entry has them
    (V1_RUNNER, "GPUModelRunner.synchronize_input_prep"): ("gone", ""),
    (V1_RUNNER, "GPUModelRunner._sync_device"): ("gone", ""),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"): (
        "body changed",
        "9814340d4d14d561 -> 05344b507e57f9ca",
    ),
    (BUFFERS, "UvaBufferPool.copy_to_uva"): (
        "body changed",
        "71c256b12faa42b0 -> b5fcc71e1d15ca6e",
    ),
    (BUFFERS, "StagedWriteTensor.apply_write"): (
        "body changed",
        "4d658f35f057bc0b -> f6a78984425a19dc",
    ),
    (V2_RUNNER, "GPUModelRunner.execute_model"): (
        "body changed",
        "b0612020048ad810 -> b0ff0d5d6ea7923f",
    ),
    (V2_RUNNER, "GPUModelRunner.add_requests"): (
        "body changed",
        "d327ae89aaee1356 -> d20c48b0f8571b15",
    ),
    (V2_RUNNER, "GPUModelRunner._dummy_run"): (
        "body changed",
        "d270e43fbe4de8a5 -> 816981015fc4d78f",
    ),
    (WARMUP, "_warmup_kernels"): ("body changed", "3dc2dbc8963410ac -> b0640522617c6f58"),
    (V2_RUNNER, "GPUModelRunner.__init__"): (
        "body changed",
        "1143fa41b54fa1b5 -> 1ec36ac8e7303878",
    ),
    (WARMUP, "run_mixed_prefill_decode_warmup"): ("signature changed", ""),
}


def test_vllm_0_34_0_against_0_33_0_names_what_changed_in_the_rows_0_33_0_relies_on(
    wheels: dict[tuple[str, str], Path], runs: dict[str, Result], data: dict[str, ModuleType]
) -> None:
    """0.33.0's entry relies on 21 functions (the one data module holds the audit's rows and
    the V2 runner's __init__ the activation bounds, where the V1-only table had 10): the V1
    runner's two are gone, eight bodies and one signature changed, ten are unchanged; its six
    watched modules but the V1 runner's are in the wheel, and its two structural checks hold;
    the draft derives the wheel's table."""
    wheel = wheels["vllm", "0.34.0"]
    result = runs["vllm 0.34.0 --against 0.33.0"]
    assert result.status == 1, result.stdout + result.stderr
    rows = function_rows(result.stdout)
    changed = {key: row for key, row in rows.items() if row[0] != "unchanged"}
    assert set(changed) == set(_CHANGED_SINCE_0_33_0)
    for key, (status, digests) in _CHANGED_SINCE_0_33_0.items():
        assert changed[key][0] == status, key
        assert not digests or changed[key][1] == f"digest {digests}", key
    assert len(rows) == 21
    assert f"not in this wheel  {V1_RUNNER} (step 'v1 runner')" in result.stdout
    assert "watched modules: 6, 1 not in this wheel" in result.stdout
    assert "structural checks: 2, 0 failing" in result.stdout
    namespace: dict[str, object] = {"_0_33_0": data["vllm"].RELEASES["0.33.0"]}
    exec(draft_of(result.stdout), namespace)
    drafted = namespace["_0_34_0"]
    assert isinstance(drafted, Release)
    assert drafted.functions == table_in_wheel(wheel, data["vllm"].RELEASES["0.33.0"])
    assert V1_RUNNER not in drafted.functions
    entry = data["vllm"].RELEASES["0.34.0"].functions
    for module, table in drafted.functions.items():  # each drafted row is the 0.34.0 entry's
        for qualname, row in table.items():
            if qualname in entry.get(module, {}):
                assert entry[module][qualname] == row, (module, qualname)


# -- a structural check the wheel does not meet --------------------------------------------------

_EXTRA_CHECK = f'''
import dataclasses

from warcore.integration.checks import Globals
from warcore.integration.releases import Engine, by_version
from warcore_sglang.releases import RELEASES

_ENVS = Globals(("envs", "ForwardMode"))  # what 0.5.23's base_attn_backend imports at run time


def _with_extra(release):
    checks = dict(release.checks)
    checks["{BASE_ATTN}"] = (*checks.get("{BASE_ATTN}", ()), _ENVS)
    return dataclasses.replace(release, checks=checks)


ENGINE = Engine(
    "wctest_sglang",
    "sglang",
    by_version(_with_extra(RELEASES[v]) for v in ("0.5.21", "0.5.23")),
    __name__,
)
'''


@pytest.fixture
def extra_engines(tmp_path: Path) -> Path:
    """A fake engine (sglang's entries with one more check), and one that fails to load."""
    root = tmp_path / "extra"
    root.mkdir()
    (root / "_wcfake_extra_check.py").write_text(_EXTRA_CHECK)
    (root / "_wcfake_broken_engine.py").write_text("raise RuntimeError('boom at import')\n")
    _dist_info(root, "warcore-fake-extra", "1.0", {"wctest_sglang": "_wcfake_extra_check:ENGINE"})
    _dist_info(
        root, "warcore-fake-broken", "1.0", {"wctest_broken": "_wcfake_broken_engine:ENGINE"}
    )
    return root


def test_a_check_the_wheel_fails_in_source_is_reported_by_name(
    wheels: dict[tuple[str, str], Path], engines: Path, extra_engines: Path, tmp_path: Path
) -> None:
    """SGLANG-RELEASES §0 row 8: 0.5.21's base_attn_backend imports neither ``envs`` nor, at run
    time, ``ForwardMode`` (only under ``TYPE_CHECKING``); 0.5.23's imports both."""
    args = ("wctest_sglang", wheels["sglang", "0.5.21"])
    result = release(engines, tmp_path, *args, path=(extra_engines,))
    assert result.status == 1, result.stdout + result.stderr
    assert "structural checks: 9, 1 failing" in result.stdout
    checks = result.stdout.split("structural checks:", 1)[1].split("\n\n", 1)[0]
    failing = [line for line in checks.splitlines() if line.startswith("    FAIL")]
    assert failing == ["    FAIL  module global envs: missing (not bound at run time)"]
    headers = [line for line in checks.splitlines()[: checks.splitlines().index(failing[0])]]
    assert [h for h in headers if not h.startswith("    ")][-1] == f"  {BASE_ATTN}"
    assert "REVIEW: check fails in " + BASE_ATTN in " ".join(result.stdout.split())
    assert "review needed: 1 check(s) fail" in result.stdout
    assert "wctest_broken" in result.stderr  # named, once, in one line, no traceback
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    passing = release(
        engines, tmp_path, "wctest_sglang", wheels["sglang", "0.5.23"], path=(extra_engines,)
    )
    assert passing.status == 0, passing.stdout
    assert "structural checks: 9, 0 failing" in passing.stdout


def test_an_engine_that_fails_to_load_is_named_in_one_line(
    engines: Path, extra_engines: Path, tmp_path: Path
) -> None:
    result = release(engines, tmp_path, "wctest_broken", "1.0", path=(extra_engines,))
    assert result.status == 2 and result.stdout == ""
    error = result.stderr.splitlines()[-1]
    assert error == (
        "warcore: error: engine integration 'wctest_broken' failed to load: "
        "_wcfake_broken_engine:ENGINE: RuntimeError: boom at import"
    )
    assert "Traceback" not in result.stderr and result.left_in_tmp == []


# -- bad input: one line, exit 2, nothing left behind -------------------------------------------


def _not_a_zip(tmp_path: Path) -> Path:
    path = tmp_path / "sglang-0.5.24-cp311-cp311-manylinux_2_34_x86_64.whl"
    path.write_text("not a zip archive\n")
    return path


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("a note\n")
    return path


BAD: dict[str, tuple[tuple[str | Callable[[Path], Path], ...], str]] = {
    "unknown engine": (("nosuch", "1.0"), "unknown engine 'nosuch'; known: "),
    "a version the index lacks": (
        ("sglang", "0.0.1"),
        "sglang 0.0.1: pip download fetched no wheel: ERROR: No matching distribution found "
        "for sglang==0.0.1",
    ),
    "neither a version nor a path": (("sglang", "latest"), "'latest' is neither a version"),
    "a file that is not a wheel": (("sglang", _text_file), "notes.txt: not a wheel"),
    "a wheel that is not a zip": (("sglang", _not_a_zip), "not a wheel (not a zip archive)"),
    "a missing wheel": (("sglang", "gone/sglang-0.5.24-py3-none-any.whl"), "no such file"),
    "an unknown --against": (
        ("sglang", "0.5.22", "--against", "0.5.99"),
        "sglang: --against 0.5.99 is not an audited release (audited: 0.5.21, 0.5.22, 0.5.23)",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_input_is_one_line_and_exit_2_leaving_nothing(
    case: str, engines: Path, tmp_path: Path
) -> None:
    args, expected = BAD[case]
    given = [arg if isinstance(arg, str) else arg(tmp_path) for arg in args]
    result = release(engines, tmp_path, *given)
    assert result.status == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("warcore: error: ") and expected in line
    assert result.left_in_tmp == []
    if case == "unknown engine":
        assert "sglang" in line and "vllm" in line


def test_a_wheel_of_another_engine_is_refused_naming_both(
    wheels: dict[tuple[str, str], Path], engines: Path, tmp_path: Path
) -> None:
    result = release(engines, tmp_path, "vllm", wheels["sglang", "0.5.23"])
    assert result.status == 2
    assert result.stderr.strip().endswith("is a wheel of sglang, not of vllm")


def test_ctrl_c_while_pip_downloads_removes_the_folder(engines: Path, tmp_path: Path) -> None:
    """SIGINT once pip is writing into the command's folder (vLLM 0.33.0: 336 MB, seconds to
    fetch): exit 130 in one line, and nothing left, pip's own temporary files included."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    python_path = [engines, *PLUGINS.values()]
    env["PYTHONPATH"] = os.pathsep.join([*map(str, python_path), env.get("PYTHONPATH", "")])
    env["TMPDIR"] = str(tmp)
    command = [sys.executable, "-m", "warcore", "release", "vllm", "0.33.0"]
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("warcore-release-*/tmp/pip-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(tmp.glob("warcore-release-*/tmp/pip-*")), "pip never started"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stdout + stderr
    assert stderr == "warcore: SIGINT: stopped; no output file was left half-written\n"
    assert list(tmp.iterdir()) == []


def _installed(tmp_path: Path, name: str, version: str) -> Path:
    """A folder where ``name`` ``version`` looks installed (its metadata, nothing else)."""
    root = tmp_path / f"{name}-{version}"
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("0.5.22", "engine: sglang 0.5.22 installed: audited, its entry in force"),
        ("0.5.20", "engine: sglang 0.5.20 installed: not an audited release (audited: "),
        ("0.5.22+local", "engine: sglang 0.5.22+local installed: not an audited release"),
    ],
)
def test_check_names_each_engines_release_in_force(
    engines: Path, tmp_path: Path, version: str, said: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    path = [_installed(tmp_path, "sglang", version), engines, *PLUGINS.values()]
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), env.get("PYTHONPATH", "")])
    env["WARCORE_PLUGINS"] = ""  # the core alone: its own lines are the control
    done = subprocess.run(
        [sys.executable, "-m", "warcore", "check"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    engine_lines = [ln for ln in done.stdout.splitlines() if ln.startswith("engine:")]
    assert done.returncode == 0, done.stdout + done.stderr  # informational: never a problem
    assert len(engine_lines) == 2, engine_lines  # sglang and vllm, each one line
    assert any(ln.startswith(said) for ln in engine_lines), engine_lines
    assert "engine: vllm is not installed" in engine_lines, engine_lines
