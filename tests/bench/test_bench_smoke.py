"""Smoke tests of ``warcore bench``: tiny sizes, the JSON's structure only, never timings.

Benchmarks are commands (their numbers are in BENCHMARKS.md); these tests only make sure the
commands run, write what BENCHMARKS.md and the plot read, and fail cleanly.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from warcore import cli
from warcore.bench import startup as bench_startup

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
TINY = ["--requests", "3", "--repeat", "1", "--layer-ms", "0", "--quiet"]


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _check_machine(result: dict[str, Any]) -> None:
    machine = result["machine"]
    for key in ("nproc", "cpu_model", "torch", "python"):
        assert machine[key], key
    assert result["command"].startswith("warcore bench ")


def _check_stats(stats: dict[str, float]) -> None:
    assert set(stats) == {"median", "min", "max"}
    assert stats["min"] <= stats["median"] <= stats["max"]


@pytest.mark.plugins("trtllm_mha")
@pytest.mark.slow
def test_overlap_writes_every_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    out = tmp_path / "overlap.json"
    code = cli.main(["bench", "overlap", *TINY, "--sched-frac", "0.3", "--json", str(out)])
    assert code == 0
    assert f"wrote {out}" in capsys.readouterr().out
    result = _load(out)
    assert result["benchmark"] == "overlap"
    _check_machine(result)
    model = result["model"]
    assert model["device"] == "sim" and model["backend"] == "trtllm_mha"
    assert model["modelled_layer_s"] == 0 and model["schedule_work_fraction"] == 0.3
    assert model["forward_s"] > 0
    variants = result["variants"]
    assert set(variants) == {
        "serial",
        "coarse",
        "fine",
        "unsafe",
        "fine/torch_native",
        "fine/fresh staging",
        "fine/late copy, persistent",
        "fine/late copy, in-graph ring",
        "fine A/A",
    }
    assert variants["fine"]["staging"] == "ring"
    assert variants["fine/fresh staging"]["staging"] == "fresh"
    late, ring = variants["fine/late copy, persistent"], variants["fine/late copy, in-graph ring"]
    assert (late["in_graph_event"], ring["in_graph_event"]) == ("persistent", "ring")
    assert late["copy_wait"] == ring["copy_wait"] == "after-next-launch"
    # Two slots per bucket for the decode graphs: twice the captured graphs of the persistent.
    assert ring["graphs"] == 2 * late["graphs"] == 2 * variants["fine"]["graphs"] > 0
    _check_stats(ring["build_s"])
    for name, v in variants.items():
        _check_stats(v["tokens_per_s"])
        _check_stats(v["tokens_per_s_ratio_to_fine"])
        _check_stats(v["idle_ms_per_gap"])
        assert len(v["runs"]) == 1
        assert v["runs_differing_from_serial"] in (0, 1)
        if name != "unsafe":  # the unsafe run may race: that is what it is for
            assert v["runs_differing_from_serial"] == 0, name
    assert variants["fine"]["tokens_per_s_ratio_to_fine"]["median"] == 1.0
    assert set(variants["fine"]["barriers"]) == {"fine"}
    assert set(variants["coarse"]["barriers"]) == {"coarse"}
    assert variants["serial"]["barriers"] == {}
    # torch_native declares nothing for EXTEND: its prefill steps take the coarse fence.
    assert variants["fine/torch_native"]["barriers"].get("coarse", 0) > 0
    assert set(result["checks"]) == {
        "fine_over_unsafe_tokens_per_s",
        "fine_over_coarse_tokens_per_s",
        "fine_over_fine_fresh_staging_tokens_per_s",
        "fine_over_fine_again_tokens_per_s",
        "in_graph_ring_over_persistent_tokens_per_s",
        "in_graph_ring_over_persistent_step_ms",
        "in_graph_ring_over_persistent_build_s",
    }


@pytest.mark.plugins("trtllm_mha")
@pytest.mark.slow
def test_sweep_writes_points_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    plot = ["--plot", str(png)] if HAS_MATPLOTLIB else []
    code = cli.main(["bench", "sweep", *TINY, "--fractions", "0,0.5", "--json", str(out), *plot])
    assert code == 0
    capsys.readouterr()
    result = _load(out)
    assert result["benchmark"] == "sweep"
    _check_machine(result)
    assert [p["fraction"] for p in result["points"]] == [0.0, 0.5]
    for point in result["points"]:
        assert set(point["fences"]) == {"coarse", "fine", "unsafe"}
        for fence in point["fences"].values():
            _check_stats(fence["step_ms"])
        _check_stats(point["ideal_step_ms"])
        _check_stats(point["fine_over_coarse_tokens_per_s"])
    assert "fine_ahead_of_coarse_from_20_percent" in result["checks"]
    if not HAS_MATPLOTLIB:
        pytest.skip("matplotlib not installed: the plot is not drawn")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `warcore bench --plot FILE` redraws a saved result without measuring.
    again = tmp_path / "again.png"
    assert cli.main(["bench", "--plot", str(again), "--sweep-json", str(out)]) == 0
    assert again.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.plugins("trtllm_mha")  # bench sweep's default backend
def test_plot_without_matplotlib_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    clean_env: None,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    for argv in (
        ["bench", "--plot", str(tmp_path / "x.png")],
        ["bench", "sweep", *TINY, "--backend", "torch_native", "--plot", str(tmp_path / "x.png")],
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "matplotlib" in err, err
    assert not (tmp_path / "x.png").exists()


def test_bench_needs_a_benchmark_or_plot(
    capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "overlap" in err and "--plot" in err


def test_startup_structure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None
) -> None:
    # The real child imports torch first (seconds); the structure does not depend on it.
    monkeypatch.setattr(bench_startup, "_CHILD", bench_startup._CHILD.replace("import torch", ""))
    result = bench_startup.measure(repeat=1, plugins=2)
    settings = result["settings"]
    assert set(settings) == {"installed", "installed+2", "installed, no bytecode"}
    base, more = settings["installed"], settings["installed+2"]
    assert more["active_plugins"] == base["active_plugins"] + 2
    # The generated plugins load (a cell of the plugin matrix may hold a broken one already).
    assert more["failed_plugins"] == base["failed_plugins"]
    assert more["backends"] == base["backends"] + 2
    for s in settings.values():
        assert set(s["ms"]) == set(bench_startup.PHASES)
    assert set(result["growth_ms_per_plugin"]) == set(bench_startup.PHASES)
    assert isinstance(result["checks"]["installed_under_50_ms"], bool)


def test_sanitizer_structure(clean_env: None) -> None:
    from warcore.bench import sanitizer as bench_sanitizer

    result = bench_sanitizer.measure((("torch_native", "none"),), requests=2, repeat=1)
    (row,) = result["combinations"]
    assert row["verdict"].startswith("sound") and row["forwards"] > 0
    for key in ("plain", "clean", "poisoned", "sanitize_total"):
        _check_stats(row[f"{key}_ms_per_forward"])
    _check_stats(row["poisoned_ratio_to_plain"])
    assert "sanitizer" in bench_sanitizer.table(result)


def test_generated_plugins_are_real_distributions(tmp_path: Path) -> None:
    import importlib.metadata as md

    names = bench_startup.generate_plugins(tmp_path, 3)
    eps = md.entry_points(group="warcore").select()
    dists = {d.metadata["Name"] for d in md.distributions(path=[str(tmp_path)])}
    assert dists == {f"warcore-{n.replace('_', '-')}" for n in names}
    assert eps is not None
