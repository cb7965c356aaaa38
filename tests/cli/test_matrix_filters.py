"""``warcore matrix --backend/--mode/--algorithm``: the filters keep exactly the cells they
name, in the table and in ``--json``, and change nothing in a cell; each is repeatable and
takes comma lists; a name that matches no cell is one line naming it and exit 2.

Names here are the core's own (``torch_native``, ``hybrid``, ``none``, ``eagle``), so every
plugin-matrix cell runs these tests, whatever it installs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from warcore import BackendSpec, hookimpl
from warcore.cli import main

# what is installed is what these check: every plugin-matrix cell runs them
pytestmark = pytest.mark.installed


def _matrix(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["matrix", "--json", *args]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["rows"]
    return rows


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of a refused ``warcore matrix``; nothing on stdout."""
    assert main(["matrix", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    return line


@pytest.fixture
def everything(clean_env: None, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The unfiltered matrix of this installation."""
    return _matrix(capsys)


@pytest.mark.parametrize(
    ("args", "field", "kept"),
    [
        (["--backend", "torch_native"], "backend", {"torch_native"}),
        (["--mode", "DECODE"], "mode", {"DECODE"}),
        (["--mode", "target_verify"], "mode", {"TARGET_VERIFY"}),  # a mode's value works too
        (["--algorithm", "eagle"], "algorithm", {"eagle"}),
        (["--backend", "torch_native,hybrid"], "backend", {"torch_native", "hybrid"}),
        (
            ["--backend", "torch_native", "--backend", "hybrid"],
            "backend",
            {"torch_native", "hybrid"},
        ),
        (["--algorithm", " none , eagle "], "algorithm", {"none", "eagle"}),
    ],
)
def test_a_filter_keeps_exactly_the_cells_it_names_unchanged(
    everything: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    field: str,
    kept: set[str],
) -> None:
    rows = _matrix(capsys, *args)
    assert {row[field] for row in rows} == kept
    # The same cells, with the same answers and in the same order, as in the whole matrix.
    assert rows == [row for row in everything if row[field] in kept]


def test_filters_combine_and_the_table_shows_the_same_cells(
    everything: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--backend", "torch_native", "--mode", "DECODE,EXTEND", "--algorithm", "none,eagle"]
    rows = _matrix(capsys, *args)
    wanted = [
        row
        for row in everything
        if row["backend"] == "torch_native"
        and row["mode"] in ("DECODE", "EXTEND")
        and row["algorithm"] in ("none", "eagle")
    ]
    assert rows == wanted and len(rows) == 4
    assert main(["matrix", *args]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["BACKEND", "MODE", "ALGORITHM"]
    assert [line.split()[:3] for line in lines] == [
        [row["backend"], row["mode"], row["algorithm"]] for row in rows
    ]


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--backend", "wctest_nosuch"], "--backend: unknown backend 'wctest_nosuch'; valid:"),
        (["--algorithm", "wctest_nosuch"], "--algorithm: unknown algorithm 'wctest_nosuch'"),
        (["--mode", "SIDEWAYS"], "--mode: unknown forward mode 'SIDEWAYS'; valid: EXTEND,"),
        # One unknown name among good ones is refused, not dropped.
        (["--backend", "torch_native,wctest_nosuch"], "unknown backend 'wctest_nosuch'"),
        (["--algorithm", "none", "--algorithm", "wctest_nosuch"], "'wctest_nosuch'"),
        (["--backend", "torch_native,,hybrid"], "--backend 'torch_native,,hybrid': an empty name"),
        (["--mode", ""], "--mode '': an empty name"),
    ],
)
def test_a_name_that_matches_nothing_is_one_line_and_exit_2(
    clean_env: None, capsys: pytest.CaptureFixture[str], args: list[str], culprit: str
) -> None:
    assert culprit in _refused(capsys, *args)
    assert culprit in _refused(capsys, "--json", *args)  # --json is refused alike


class OtherEngine:
    """A backend of another engine: the matrix pairs it with ``none`` only."""

    @hookimpl
    def warcore_attention_backends(self) -> list[BackendSpec]:
        return [BackendSpec("wctest_elsewhere", _never, "another engine's", engine="wctest_eng")]


def _never(**kwargs: Any) -> Any:
    raise AssertionError("never built")


def test_a_combination_that_leaves_a_name_no_cell_names_it_and_the_other_filters(
    clean_env: None, capsys: pytest.CaptureFixture[str], register_for_test: Callable[..., Any]
) -> None:
    register_for_test(OtherEngine())
    assert {row["algorithm"] for row in _matrix(capsys, "--backend", "wctest_elsewhere")} == {
        "none"
    }
    line = _refused(capsys, "--backend", "wctest_elsewhere", "--algorithm", "eagle")
    assert "'wctest_elsewhere' matches no matrix cell with --algorithm eagle" in line


@pytest.mark.plugins("trtllm_mha")
def test_a_disabled_plugins_backend_says_which_variable_disabled_it(
    clean_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARCORE_DISABLE_PLUGINS", "trtllm_mha")
    line = _refused(capsys, "--backend", "trtllm_mha")
    assert "--backend: backend 'trtllm_mha' is disabled" in line
    assert "WARCORE_DISABLE_PLUGINS" in line


def test_the_help_says_how_the_filters_take_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["matrix", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--backend", "--mode", "--algorithm"):
        assert f"{option} NAME[,NAME...]" in text, option
    assert text.count("repeatable, each a comma list") == 3
    assert "A name that matches no cell is an error (exit 2)" in text
