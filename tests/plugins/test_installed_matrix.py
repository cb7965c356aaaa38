"""What `warcore plugins --json` and `warcore matrix --json` say matches what is installed.

The expectations come from the installed distributions' metadata and the plugins' documented
declarations, not from warcore's resolver. The plugin-matrix cells (``matrix.toml``, run by
noxfile.py) run this file in environments holding different sets of plugins, third-party ones
included, and set ``WARCORE_EXPECT_PLUGINS`` to the entry-point names the cell's distributions
declare, so a leaked or missing plugin fails the cell. A third-party backend or algorithm is
checked for what every plugin owes (listed, active, in the matrix, ``check`` clean); the
record points are checked only for the backends and algorithms of this repository.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from typing import Any

import pytest

# what is installed is what these check: every plugin-matrix cell runs them
pytestmark = pytest.mark.installed

PUBLISHING_AT_EXTEND = {"none", "dflash", "dspark", "ngram"}  # eagle's prefill does not publish
OUR_ALGORITHMS = PUBLISHING_AT_EXTEND | {"eagle"}
"""The core's and this repository's algorithms, whose publish phases the docs document."""
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


def _offers(installed: set[str]) -> dict[str, dict[str, Any]]:
    """What the core and every installed plugin offer, asked of their own spec hooks (not of
    warcore's registry): ``{"backends" | "algorithms": {name: spec}}``, without the names two
    plugins offer (those are disabled; a plugin's offer of a core name is ignored)."""
    from warcore.engine import builtin_plugin

    offered: dict[str, dict[str, list[tuple[str, Any]]]] = {"backends": {}, "algorithms": {}}
    sources: list[tuple[str, object]] = [("warcore", builtin_plugin)]
    for ep in md.entry_points(group="warcore"):
        if ep.name in installed and ep.name != "broken_fixture":
            sources.append((ep.name, ep.load()))
    for plugin, module in sources:
        for kind, hook in (
            ("backends", "warcore_attention_backends"),
            ("algorithms", "warcore_speculative_algorithms"),
        ):
            function = getattr(module, hook, None)
            for spec in (function() or ()) if callable(function) else ():
                offered[kind].setdefault(spec.name, []).append((plugin, spec))
    result: dict[str, dict[str, Any]] = {}
    for kind, names in offered.items():
        result[kind] = {}
        for name, offers in names.items():
            core = [spec for plugin, spec in offers if plugin == "warcore"]
            if core or len(offers) == 1:
                result[kind][name] = core[0] if core else offers[0][1]
    return result


def test_matrix_covers_exactly_the_installed_backends_and_algorithms(installed: set[str]) -> None:
    rows = _json("matrix")["rows"]
    backends = {r["backend"] for r in rows}
    algorithms = {r["algorithm"] for r in rows}
    offers = _offers(installed)
    # Every name in the matrix is offered by the core or exactly one installed plugin, and
    # every one offered for the reference engine is in it (an engine's own names, sglang's,
    # meet only that engine's).
    assert backends <= set(offers["backends"]) and algorithms <= set(offers["algorithms"])
    ours = {n for n, spec in offers["backends"].items() if spec.engine == "warcore"}
    assert ours <= backends
    assert {n for n, spec in offers["algorithms"].items() if spec.engine == "warcore"} <= algorithms
    assert {"torch_native", "hybrid", "layer_hybrid"} <= backends and {
        "none",
        "eagle",
    } <= algorithms
    assert ("trtllm_mha" in backends) == ("trtllm_mha" in installed)
    assert ("deepseek_v4" in backends) == ("deepseek_v4" in installed)
    assert ("dflash" in algorithms) == ("dflash" in installed)


def test_extend_publishes_only_through_the_snapshotting_plugins(installed: set[str]) -> None:
    # trtllm_mha snapshots every prefill; deepseek_v4 declares PRE_REPLAY and withdraws it per
    # batch (the matrix marks it "per batch"); the core's backends never publish a prefill.
    snapshotting = {"trtllm_mha", "deepseek_v4"}
    for row in _json("matrix")["rows"]:
        if row["mode"] != "EXTEND" or row["backend"] not in OUR_BACKENDS:
            continue  # a third-party backend (the acme example) declares for itself
        if row["algorithm"] not in OUR_ALGORITHMS:
            continue  # so does a third-party algorithm: its publish phase is its own
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
