"""The ``warcore`` command line on the real installation (core plus the three plugins)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warcore import cli

pytestmark = pytest.mark.plugins()

DISTRIBUTIONS = {
    "trtllm_mha": "warcore-trtllm-mha",
    "deepseek_v4": "warcore-deepseek-v4",
    "dflash": "warcore-dflash",
}


def _env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    env.update(variables)
    return env


def _warcore(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "warcore", *args],
        env=_env(**variables),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str, str], dict[str, Any]]:
    result = _warcore("matrix", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    return {(r["backend"], r["mode"], r["algorithm"]): r for r in rows}


def test_plugins_json_lists_the_three_plugins_active() -> None:
    result = _warcore("plugins", "--json")
    assert result.returncode == 0, result.stderr
    infos = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    for name, dist in DISTRIBUTIONS.items():
        info = infos[name]
        assert info["status"] == "active", info
        assert info["distribution"] == dist
        assert info["version"] == md.version(dist)
        assert info["error"] is None
        assert Path(info["path"]).name == "__init__.py"
    assert set(infos["trtllm_mha"]["hooks"]) == {
        "warcore_attention_backends",
        "warcore_shared_read_boundary",
    }
    assert set(infos["dflash"]["hooks"]) == {
        "warcore_is_war_publish_phase",
        "warcore_speculative_algorithms",
    }
    assert infos["warcore"]["status"] == "active"  # the core's built-ins are listed too


def test_plugins_table_is_aligned(clean_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0]
    assert header.split() == [
        "NAME", "DISTRIBUTION", "VERSION", "STATUS", "REGISTERED", "BY", "LOAD", "MS", "HOOKS",
        "ERROR", "OR", "WARNING",
    ]  # fmt: skip
    column = header.index("STATUS")
    rows = {line.split()[0]: line for line in lines[1:]}
    for name in DISTRIBUTIONS:
        assert rows[name][column:].startswith("active")


def test_matrix_rows_cover_every_backend_mode_and_algorithm(
    matrix: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    backends = {b for b, _, _ in matrix}
    modes = {m for _, m, _ in matrix}
    algorithms = {a for _, _, a in matrix}
    assert backends >= {"torch_native", "trtllm_mha", "deepseek_v4"}
    assert modes == {"EXTEND", "DECODE", "MIXED", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND",
                     "DRAFT_EXTEND_V2", "PREBUILT", "SPLIT_PREFILL", "DLLM_EXTEND"}  # fmt: skip
    assert algorithms >= {"none", "eagle", "dflash", "dspark"}
    assert len(matrix) == len(backends) * len(modes) * len(algorithms)


def test_matrix_trtllm_extend_publishes_before_replay(
    matrix: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    row = matrix[("trtllm_mha", "EXTEND", "none")]
    assert row["boundary"] == "PRE_REPLAY" and row["boundary_source"] == "plugin:trtllm_mha"
    assert row["runner"] == "prefill"
    assert row["record_point"] == "pre_replay" and row["source"] == "plugin:trtllm_mha"
    # eagle's draft-extend reads later: prefill is not its publish phase.
    assert matrix[("trtllm_mha", "EXTEND", "eagle")]["record_point"] == "none"


def test_matrix_torch_native_extend_publishes_nothing(
    matrix: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    row = matrix[("torch_native", "EXTEND", "none")]
    assert row["boundary"] == "UNKNOWN" and row["boundary_source"] == "default:no-answer"
    assert row["record_point"] == "none"
    decode = matrix[("torch_native", "DECODE", "none")]
    assert (decode["boundary"], decode["record_point"]) == ("IN_REPLAY", "in_graph_node")
    assert decode["source"] == "contract:warcore"


def test_matrix_deepseek_verify_depends_on_the_algorithm(
    matrix: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    dflash = matrix[("deepseek_v4", "TARGET_VERIFY", "dflash")]
    assert (dflash["boundary"], dflash["record_point"]) == ("POST_REPLAY", "post_replay")
    assert dflash["source"] == "plugin:deepseek_v4"
    dspark = matrix[("deepseek_v4", "TARGET_VERIFY", "dspark")]
    assert (dspark["boundary"], dspark["record_point"]) == ("IN_REPLAY", "in_graph_node")
    eagle = matrix[("deepseek_v4", "TARGET_VERIFY", "eagle")]
    assert eagle["record_point"] == "none" and eagle["publish_phase"] is False


def test_matrix_modes_without_a_runner_publish_nothing(
    matrix: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    for (_, mode, _), row in matrix.items():
        if mode in ("MIXED", "IDLE", "DRAFT_EXTEND"):
            assert (row["runner"], row["record_point"], row["source"]) == (
                None, "none", "no-runner"
            )  # fmt: skip


def test_matrix_json_shows_each_algorithms_prefill_staging(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stage, then publish (issue 20): eagle's prefill publishes early only when staged, so
    its static point is none and its staged point pre_replay; dflash's needs no staging."""
    argv = ["matrix", "--json", "--backend", "trtllm_mha", "--mode", "EXTEND"]
    assert cli.main([*argv, "--algorithm", "eagle,dflash"]) == 0
    rows = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    eagle, dflash = rows["eagle"], rows["dflash"]
    assert (eagle["prefill_staging"], eagle["record_point"]) == ("stages", "none")
    assert eagle["staged_record_point"] == "pre_replay"
    assert (dflash["prefill_staging"], dflash["staged_record_point"]) == ("not needed", "none")
    assert dflash["record_point"] == "pre_replay"


def test_matrix_flag_changes_the_trtllm_draft_extend_boundary(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def draft_extend(*flags: str) -> dict[str, Any]:
        assert cli.main(["matrix", "--json", *flags]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        [row] = [
            r
            for r in rows
            if (r["backend"], r["mode"], r["algorithm"])
            == ("trtllm_mha", "DRAFT_EXTEND_V2", "eagle")
        ]
        return row

    assert draft_extend()["record_point"] == "in_graph_node"
    assert draft_extend("--flag", "nccl_allgather_in_overlap")["record_point"] == "post_replay"
    assert draft_extend("--flag", "nccl_allgather_in_overlap=0")["record_point"] == "in_graph_node"


def test_matrix_table_has_a_header_and_one_line_per_cell(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["matrix"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["BACKEND", "MODE", "ALGORITHM"]
    assert any(line.split()[:3] == ["trtllm_mha", "EXTEND", "none"] for line in lines)
    # Every cell filled: each line has text at every column's start (cells may hold spaces,
    # a veto's reason or "pre_replay (per batch)", so words are not counted).
    header = lines[0]
    starts = [
        i for i in range(len(header)) if header[i] != " " and (i == 0 or header[i - 2 : i] == "  ")
    ]
    # ... RECORD POINT, BECAUSE, EAGER, EVENT OWNER, HOST SLOT, PREFILL STAGING
    assert len(starts) == 12, header
    for line in lines[1:]:
        assert all(line[i] != " " and (i == 0 or line[i - 1] == " ") for i in starts), line


@pytest.mark.clean_install
def test_check_passes_on_the_clean_install() -> None:
    result = _warcore("check")
    assert result.returncode == 0, result.stdout + result.stderr
    *lines, last = result.stdout.strip().splitlines()
    assert last == "ok"
    # an engine integration registered here (the checkout's, scripts/setup.sh) says which of
    # its releases is installed: informational too
    staging = [line for line in lines if not line.startswith("engine: ")]
    # Informational: each algorithm's prefill staging hook's answer (issue 20, stage then
    # publish): the built-in eagle stages, the block drafters need none.
    assert all(line.startswith("staging: algorithm ") for line in staging), staging
    answers = {line.split("'")[1]: line.split("): ", 1)[1].split(" (")[0] for line in staging}
    assert answers["eagle"] == "stages" and answers["dflash"] == "not needed", answers


def test_malformed_environment_is_exit_2_with_one_line() -> None:
    result = _warcore("check", WARCORE_STRICT_PLUGINS="maybe")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "WARCORE_STRICT_PLUGINS" in lines[0] and "'maybe'" in lines[0]


def test_unknown_command_is_a_usage_error() -> None:
    result = _warcore("frobnicate")
    assert result.returncode == 2
    assert "frobnicate" in result.stderr


def test_bench_lookup_writes_json(
    clean_env: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "lookup", "--number", "200", "--repeat", "1", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "decision-cache lookup" in printed and "pluggy hook call" in printed
    data = json.loads(out.read_text())
    assert set(data["ns_per_call"]) == {"lookup", "direct", "pluggy"}
    assert all(v > 0 for v in data["ns_per_call"].values())
    assert data["ratio_to_direct"]["direct"] == 1.0
    assert set(data["pluggy_hookimpls"]) >= {"trtllm_mha", "deepseek_v4"}
