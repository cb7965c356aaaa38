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

import ast
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
from _support.signals import sigint_as_a_terminal_sends_it

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


WHEELS_AT = os.environ.get("WARCORE_TEST_WHEELS", "")
"""A folder already holding the wheels (``pip download --no-deps -d FOLDER``), to read them
there, not download them again; empty: downloaded into the session's temporary folder."""


def _on_disk(distribution: str, version: str) -> Path | None:
    found = sorted(Path(WHEELS_AT).glob(f"{distribution}-{version}-*.whl")) if WHEELS_AT else []
    return found[0] if found else None


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """The five wheels, downloaded from the index at once (several seconds: ~700 MB), or read
    from ``WARCORE_TEST_WHEELS``."""
    folder = tmp_path_factory.mktemp("wheels")
    found: dict[tuple[str, str], Path] = {
        wanted: path for wanted in WANTED if (path := _on_disk(*wanted)) is not None
    }
    started = {
        wanted: _pip_download(*wanted, folder / "-".join(wanted))
        for wanted in WANTED
        if wanted not in found
    }
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
    for newer, older in (("0.5.23", "0.5.22"), ("0.5.22", "0.5.21")):
        commands[f"sglang {newer} --against {older}"] = (
            "sglang",
            wheels["sglang", newer],
            "--against",
            older,
        )
    # by its version: the command fetches it itself
    commands["fetch sglang 0.5.22 --against 0.5.23"] = ("sglang", "0.5.22", "--against", "0.5.23")
    started = {name: Running(engines, folder, *args) for name, args in commands.items()}
    return {name: running.result() for name, running in started.items()}


STATUSES = ("signature changed", "body changed", "unchanged", "moved", "gone")


def grouped_lines(report: str, head: str) -> Iterator[tuple[str, str]]:
    """(group, row) of the report's section starting ``head``: each row (stripped) under the
    line naming its group (a module, a surface section)."""
    section = report.split(head, 1)[1].split("\n\n", 1)[0]
    group = ""
    for line in section.splitlines()[1:]:
        if line.startswith("    "):
            yield group, line.strip()
        else:
            group = line.strip()


def function_rows(report: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, qualname) -> (status, detail), read from the report's functions section."""
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    for module, line in grouped_lines(report, "relied-on functions:"):
        status = next(s for s in STATUSES if line.startswith(s))
        qualname, _, detail = line[len(status) :].strip().partition(" ")
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
    assert f"WAR surface against {version}'s ({version}.json): 0 differ" in result.stdout


# -- sglang 0.5.22 and 0.5.21 against 0.5.23 (SGLANG-RELEASES §2) --------------------------------

DISAGG_PREFILL = S + "disaggregation.prefill"
_PREFILL_LOOP = (
    DISAGG_PREFILL,
    "SchedulerDisaggregationPrefillMixin.event_loop_overlap_disagg_prefill",
)
_GONE_SINCE_0_5_23 = {
    (BASE_ATTN, "AttentionBackend.resolve_prefill_shared_read_ends"),
    (BASE_ATTN, "AttentionBackend._snapshot_prefill_shared_reads"),
    # the disaggregated prefill's reader of the owner's event (issue 41)
    (DISAGG_PREFILL, "SchedulerDisaggregationPrefillMixin._war_barrier_is_coarse"),
}
_CONN = "sglang.srt.disaggregation.mooncake.conn"
_DECODE = "sglang.srt.disaggregation.decode"
_REGISTRATION = (_CONN, "MooncakeKVManager.build_receiver_registration_message")
_VERDICT = (_CONN, "MooncakeKVManager._validate_peer_state_layout")
_PUBLISH = (_CONN, "MooncakeKVManager._publish_peer_registration")
_TRANSFER = (_CONN, "MooncakeKVManager.transfer_worker")
_SEND = (_DECODE, "DecodePreallocQueue._send_kv_metadata")
_POP = (_DECODE, "DecodePreallocQueue.pop_preallocated")
_PUBLISHER = (PUBLISHER, "maybe_publish_prefill_shared_read_done")
_RESOLVE = (DECODE_RUNNER, "DecodeCudaGraphRunner._resolve_shared_read_ends")


@pytest.fixture
def sglang_0_5_22(runs: dict[str, Result]) -> Result:
    """``warcore release sglang 0.5.22 --against 0.5.23``: the command fetches it itself."""
    return runs["fetch sglang 0.5.22 --against 0.5.23"]


def _expect_against_0_5_23(
    rows: dict[tuple[str, str], tuple[str, str]], gone: set[tuple[str, str]]
) -> dict[str, set[tuple[str, str]]]:
    by_status: dict[str, set[tuple[str, str]]] = {}
    for key, (status, _) in rows.items():
        by_status.setdefault(status, set()).add(key)
    assert len(rows) == 32  # 0.5.23's table
    assert by_status["gone"] == _GONE_SINCE_0_5_23 | gone
    assert by_status["signature changed"] == {_PUBLISHER}
    assert rows[_PUBLISHER][1] == (
        "(model_runner, shared_read_ends, device_module) -> "
        "(model_runner, forward_batch, device_module)"
    )
    return by_status


def test_sglang_0_5_22_against_0_5_23_reports_three_gone_one_signature_one_body(
    sglang_0_5_22: Result,
) -> None:
    assert sglang_0_5_22.status == 1, sglang_0_5_22.stdout + sglang_0_5_22.stderr
    assert "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl" in sglang_0_5_22.stdout
    # the PD pairing's registration builder: 0.5.22 builds the message inline
    by_status = _expect_against_0_5_23(function_rows(sglang_0_5_22.stdout), {_REGISTRATION})
    assert by_status["body changed"] == {_PREFILL_LOOP, _POP, _VERDICT, _PUBLISH, _TRANSFER}
    assert len(by_status["unchanged"]) == 22 and set(by_status) == {
        "unchanged",
        "gone",
        "signature changed",
        "body changed",
    }
    assert "watched modules: 11, every one in this wheel" in sglang_0_5_22.stdout
    # 0.5.23's prefill loop asks the coarse reader; 0.5.22's has none, nor the registration
    assert "structural checks: 16, 2 failing" in sglang_0_5_22.stdout
    assert f"FAIL  {_PREFILL_LOOP[1]}: no longer calls self._war_barrier_is_coarse(...)" in (
        sglang_0_5_22.stdout
    )
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
    by_status = _expect_against_0_5_23(rows, {_REGISTRATION, _VERDICT, _PUBLISH})
    assert by_status["body changed"] == {_RESOLVE, _PREFILL_LOOP, _SEND, _POP, _TRANSFER}
    assert len(by_status["unchanged"]) == 20
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
    assert "structural checks: 14, 1 failing" in result.stdout
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
    assert "structural checks: 17, 0 failing" in passing.stdout


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
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_a_terminal_sends_it,
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


# -- the WAR surface: what is new in a release, against the base's committed surface ----------


def surface_rows(report: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(section, key) -> (added|removed|changed, what is shown), read from the report's
    surface section."""
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    for section, line in grouped_lines(report, "WAR surface against "):
        kind, rest = line.split(None, 1)
        key, _, shown = rest.partition(": ")
        rows[section, key] = (kind, shown)
    return rows


def _review_lines(report: str) -> str:
    """The draft's REVIEW comments, joined back into one text."""
    lines = [ln.strip().removeprefix("# ") for ln in report.splitlines() if ln.strip()[:1] == "#"]
    return " ".join(lines)


ATTN = S + "layers.attention."


def test_sglang_0_5_23_against_0_5_22_reports_what_was_found_by_hand(
    runs: dict[str, Result],
) -> None:
    """SGLANG-RELEASES: the prefill switch's default, the new backend's declarations, the Dots
    and DeepSeek V4 declarations, the disaggregation reader and the registry change."""
    result = runs["sglang 0.5.23 --against 0.5.22"]
    assert result.status == 1, result.stdout + result.stderr
    rows = surface_rows(result.stdout)
    switch = ("WAR switches", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
    assert rows[switch] == ("changed", "EnvBool(False) -> EnvBool(True)")
    declared = "declaration points"
    assert (
        rows[
            declared,
            ATTN + "minimax_sparse_nvfp4_backend:MiniMaxSparseNvfp4AttnBackend.shared_read_ends",
        ][0]
        == "added"
    )
    assert (
        rows[declared, ATTN + "dots_hybrid_backend:DotsSWAMLAAttnBackend.shared_read_ends"][0]
        == "changed"
    )
    assert (
        rows[declared, ATTN + "deepseek_v4_backend:DeepseekV4AttnBackend.shared_read_ends"][0]
        == "changed"
    )
    reader = f"{DISAGG_PREFILL}:SchedulerDisaggregationPrefillMixin._war_barrier_is_coarse"
    assert rows["event readers and barrier callers", reader] == (
        "added",
        "ev = self.model_worker.last_shared_read_runner.shared_read_done_event",
    )
    assert rows["attention registry", "tokenspeed_mla"] == (
        "removed",
        ATTN + "tokenspeed_mla_backend:TokenspeedMLABackend",
    )
    review = _review_lines(result.stdout)
    assert "REVIEW: surface: WAR switches: SGLANG_ENABLE_PREFILL_WAR_READ_DONE changed" in review
    assert "REVIEW: surface: attention registry: tokenspeed_mla removed" in review
    assert "WAR surface entr(ies) differ" in result.stdout


def test_sglang_0_5_22_against_0_5_21_reports_its_registry_change(
    runs: dict[str, Result],
) -> None:
    result = runs["sglang 0.5.22 --against 0.5.21"]
    assert result.status == 1, result.stdout + result.stderr
    rows = surface_rows(result.stdout)
    assert rows["attention registry", "llada2_cfg_flashinfer"] == (
        "added",
        ATTN + "llada2_cfg_flashinfer_backend:LLaDA2CFGFlashInferAttnBackend",
    )
    assert "WAR switches" not in {section for section, _ in rows}  # False in both


def test_vllm_0_34_0_against_0_33_0_reports_the_entry_point_ring_users_and_warmups(
    runs: dict[str, Result],
) -> None:
    """VLLM-0.34: the second entry point, the two new ring users, the two new warmups."""
    result = runs["vllm 0.34.0 --against 0.33.0"]
    rows = surface_rows(result.stdout)
    assert rows["ring entry points", "UvaBufferPool.copy_chunks_to_uva"][0] == "added"
    users = {
        key.split(":")[1]
        for (section, key), row in rows.items()
        if section == "ring users" and row[0] == "added"
    }
    assert {"NoRepeatNGramLogitsProcessor", "PageCountGuardLogitsProcessor"} <= users
    warmups = {
        key
        for (section, key), row in rows.items()
        if section == "step runners" and row[0] == "added"
    }
    assert {f"{WARMUP}:run_context_prefill_warmup", f"{WARMUP}:run_kv_cache_sizing_warmup"} <= (
        warmups
    )
    assert "REVIEW: surface: ring entry points: UvaBufferPool.copy_chunks_to_uva added" in (
        _review_lines(result.stdout)
    )


# -- hand-made edits of the kind the next release brings, each in a wheel built here --------


def _sources_only(wheel: Path, folder: Path, edit: Callable[[dict[str, str]], None]) -> Path:
    """A copy of ``wheel`` holding only its Python sources and metadata (what the command
    reads), under the same name, with ``edit`` applied to ``{member: text}``."""
    folder.mkdir()
    with zipfile.ZipFile(wheel) as archive:
        members = {
            info.filename: archive.read(info).decode("utf-8", "replace")
            for info in archive.infolist()
            if info.filename.endswith(".py") or ".dist-info/" in info.filename
        }
    edit(members)
    out = folder / wheel.name
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return out


def _after_last_member(text: str, cls: str, line: str) -> str:
    """``text`` with ``line`` (indented) after the last assignment of class ``cls``."""
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls)
    last = [n for n in node.body if isinstance(n, ast.Assign)][-1]
    lines = text.splitlines(keepends=True)
    assert last.end_lineno is not None
    lines.insert(last.end_lineno, f"    {line}\n")
    return "".join(lines)


SG = "sglang/srt/"
_NEW_BACKEND = """

@register_attention_backend("wctest_backend")
def create_wctest_backend(runner):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend(runner)
"""
_NEW_WORKER = """from sglang.srt.speculative.base_spec_worker import BaseSpecWorker


class WctestWorkerV2(BaseSpecWorker):
    @property
    def last_shared_read_runner(self):
        return self.draft_worker.draft_runner
"""
_NEW_RING_USER = """from vllm.v1.worker.gpu.buffer_utils import UvaBackedTensor


class WctestLogitsProcessor:
    def __init__(self, max_num_reqs):
        self.sizes = UvaBackedTensor(max_num_reqs)

    def apply_staged_writes(self):
        self.sizes.copy_to_uva()
"""
_BACK_TO_BACK = """

def run_wctest_warmup(model_runner, worker_execute_model, worker_sample_tokens):
    for _ in range(2):
        worker_execute_model(None)
        worker_sample_tokens(None)
"""


def _add(member: str, text: str) -> Callable[[dict[str, str]], None]:
    def edit(members: dict[str, str]) -> None:
        members[member] = members.get(member, "") + text

    return edit


def _forward_mode(members: dict[str, str]) -> None:
    path = SG + "model_executor/forward_batch_info.py"
    members[path] = _after_last_member(members[path], "ForwardMode", "WCTEST_MODE = 1000")


def _prefill_caller(members: dict[str, str]) -> None:
    path = SG + "model_executor/runner/eager_runner.py"
    call = "maybe_publish_prefill_shared_read_done("
    assert members[path].count(call) == 1  # the one call (the import names it bare)
    head, tail = members[path].rsplit(call, 1)
    members[path] = head + call + "model_runner.wctest_other, " + tail


EAGER = S + "model_executor.runner.eager_runner:EagerRunner._execute_extend"
EDITS: dict[str, tuple[str, Callable[[dict[str, str]], None], dict[tuple[str, str], str]]] = {
    "nothing (the sources alone)": ("sglang", lambda members: None, {}),
    "a new ForwardMode member": (
        "sglang",
        _forward_mode,
        {("ForwardMode", "WCTEST_MODE"): "added"},
    ),
    "a new registered backend": (
        "sglang",
        _add(SG + "layers/attention/attention_registry.py", _NEW_BACKEND),
        {("attention registry", "wctest_backend"): "added"},
    ),
    "a new speculative worker with its own event owner": (
        "sglang",
        _add(SG + "speculative/wctest_worker_v2.py", _NEW_WORKER),
        {
            (
                "declaration points",
                S + "speculative.wctest_worker_v2:WctestWorkerV2.last_shared_read_runner",
            ): "added",
        },
    ),
    "a prefill caller passing other arguments": (
        "sglang",
        _prefill_caller,
        {("event readers and barrier callers", EAGER): "changed"},
    ),
    "vllm: nothing (the sources alone)": ("vllm", lambda members: None, {}),
    "a new ring user": (
        "vllm",
        _add("vllm/wctest_ring_user.py", _NEW_RING_USER),
        {
            ("ring users", "vllm.wctest_ring_user:WctestLogitsProcessor"): "added",
            (
                "ring callers",
                "vllm.wctest_ring_user:WctestLogitsProcessor.apply_staged_writes",
            ): "added",
        },
    ),
    "a new warmup running steps back to back": (
        "vllm",
        _add("vllm/v1/worker/gpu/warmup.py", _BACK_TO_BACK),
        {("step runners", f"{WARMUP}:run_wctest_warmup"): "added"},
    ),
}


@pytest.mark.parametrize("case", EDITS, ids=str)
def test_each_hand_made_edit_is_reported(
    case: str, wheels: dict[tuple[str, str], Path], engines: Path, tmp_path: Path
) -> None:
    """The newest audited wheel's sources, edited as the next release might: the surface
    says exactly that edit (the unedited sources: nothing), and the draft asks to review it."""
    engine, edit, expected = EDITS[case]
    version = {"sglang": "0.5.23", "vllm": "0.34.0"}[engine]
    wheel = _sources_only(wheels[engine, version], tmp_path / "edited", edit)
    result = release(engines, tmp_path, engine, wheel)
    rows = surface_rows(result.stdout)
    assert {key: kind for key, (kind, _) in rows.items()} == expected, result.stdout
    if not expected:
        assert result.status == 0, result.stdout + result.stderr
        return
    assert result.status == 1, result.stdout + result.stderr
    review = _review_lines(result.stdout)
    for section in {section for section, _ in expected}:
        assert f"REVIEW: surface: {section}: " in review
    if case == "a new warmup running steps back to back":
        shown = rows["step runners", f"{WARMUP}:run_wctest_warmup"][1]
        assert shown == (
            "loop[step worker_execute_model, step worker_sample_tokens]"
        )  # no wait between the steps
    if case == "a prefill caller passing other arguments":
        assert "model_runner.wctest_other" in rows["event readers and barrier callers", EAGER][1]


# -- in the checkout after the README's set-up (scripts/setup.sh), no PYTHONPATH --------------


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
    reason="the README's set-up's .venv only (scripts/setup.sh links the integrations' data)",
)
@pytest.mark.parametrize("wanted", [("sglang", "0.5.22"), ("vllm", "0.34.0")], ids="-".join)
def test_the_checkouts_venv_knows_both_engines_without_their_plugins(
    wanted: tuple[str, str], wheels: dict[tuple[str, str], Path], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WARCORE_", "PYTHONPATH"))}
    done = subprocess.run(
        [sys.executable, "-m", "warcore", "release", wanted[0], str(wheels[wanted])],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"nothing changed: {wanted[1]} matches its audited entry" in done.stdout
    assert done.stderr == ""
    # the release data only: no warcore plugin of either integration is registered here
    plugins = subprocess.run(
        [sys.executable, "-m", "warcore", "plugins", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plugins.returncode == 0, plugins.stderr
    assert "warcore-sglang" not in plugins.stdout and "warcore_sglang" not in plugins.stdout
