"""What `warcore plugins --json` and `warcore matrix --json` say matches what is installed.

The expectations come from the installed distributions' metadata and the plugins' documented
declarations, not from warcore's resolver. The plugin-matrix cells (noxfile.py) run this file in
environments holding different subsets of the plugins and set ``WARCORE_EXPECT_PLUGINS`` to the
entry-point names the cell installed, so a leaked or missing plugin fails the cell.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from typing import Any

import pytest

PUBLISHING_AT_EXTEND = {"none", "dflash", "dspark", "ngram"}  # eagle's prefill does not publish
OUR_BACKENDS = {"torch_native", "trtllm_mha", "deepseek_v4"}


def _warcore(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "warcore", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _json(*args: str) -> Any:
    result = _warcore(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def installed() -> set[str]:
    names = {ep.name for ep in md.entry_points(group="warcore")}
    expected = os.environ.get("WARCORE_EXPECT_PLUGINS")
    if expected is not None:
        assert names == {n for n in expected.split(",") if n}, "the environment holds other plugins"
    return names


def test_plugins_lists_exactly_the_installed_plugins(installed: set[str]) -> None:
    plugins = {p["name"]: p for p in _json("plugins")["plugins"]}
    assert set(plugins) == installed | {"warcore"}
    for name in installed:
        info = plugins[name]
        if name == "broken_fixture":
            assert info["status"] == "failed" and "ImportError" in info["error"]
        else:
            assert info["status"] == "active", info
            assert info["distribution"] and info["version"]


def test_matrix_covers_exactly_the_installed_backends_and_algorithms(installed: set[str]) -> None:
    rows = _json("matrix")["rows"]
    backends = {r["backend"] for r in rows}
    algorithms = {r["algorithm"] for r in rows}
    assert {"torch_native"} <= backends
    assert ("trtllm_mha" in backends) == ("trtllm_mha" in installed)
    assert ("deepseek_v4" in backends) == ("deepseek_v4" in installed)
    assert algorithms == {"none", "eagle"} | (
        {"dflash", "dspark"} if "dflash" in installed else set()
    ) | ({"ngram"} if "ngram" in installed else set())  # examples/ngram_algorithm


def test_extend_publishes_only_through_the_snapshotting_plugins(installed: set[str]) -> None:
    # trtllm_mha snapshots every prefill; deepseek_v4 declares PRE_REPLAY and withdraws it per
    # batch (the matrix marks it "per batch"); the core's backends never publish a prefill.
    snapshotting = {"trtllm_mha", "deepseek_v4"}
    for row in _json("matrix")["rows"]:
        if row["mode"] != "EXTEND" or row["backend"] not in OUR_BACKENDS:
            continue  # a third-party backend (the acme example) declares for itself
        publishes = row["backend"] in snapshotting and row["algorithm"] in PUBLISHING_AT_EXTEND
        assert row["record_point"] == ("pre_replay" if publishes else "none"), row
        assert row["per_batch"] is publishes, row


def test_deepseek_verify_follows_its_plugin(installed: set[str]) -> None:
    if "deepseek_v4" not in installed or "dflash" not in installed:
        pytest.skip("needs deepseek_v4 and dflash")
    verify = {
        r["algorithm"]: r["record_point"]
        for r in _json("matrix")["rows"]
        if r["backend"] == "deepseek_v4" and r["mode"] == "TARGET_VERIFY"
    }
    assert verify["dflash"] == "post_replay" and verify["dspark"] == "in_graph_node"
    assert verify["eagle"] == "none"  # eagle publishes at draft-extend, not at verify


def test_check_fails_exactly_when_a_plugin_is_broken(installed: set[str]) -> None:
    result = _warcore("check")
    if "broken_fixture" in installed:
        assert result.returncode == 1 and "broken_fixture" in result.stdout
    else:
        assert result.returncode == 0, result.stdout + result.stderr
