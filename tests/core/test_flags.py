"""Engine flags are a declared set: the core's (``CORE_FLAGS``) and the plugins' own (hook
``warcore_engine_flags``). A name nobody declared, or a value of the wrong kind, is an error
naming the flag and the valid ones, on the command line (exit 2) and in the Python API: an
ignored flag can keep an earlier record point than the engine really allows."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from _support import ROOT, fresh_manager

import warcore
from warcore import cli
from warcore.core import (
    CORE_FLAGS,
    FlagSpec,
    WarcorePluginManager,
    get_registry,
)
from warcore.engine import Engine, EngineConfig

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic

TYPO = "nccl_allgather_in_overlapp"


class OffloadPlugin:
    """A plugin that reads flags of its own and declares them."""

    @warcore.hookimpl
    def warcore_engine_flags(self) -> list[FlagSpec]:
        return [
            FlagSpec("wctest_my_offload", bool, False, "my KV offloader is on"),
            FlagSpec(
                "wctest_my_offload_chunks",
                int,
                4,
                "chunks my offloader keeps on the host",
                bounds=(1, 64),
            ),
        ]


class SameFlagPlugin:
    """Declares the very same flag as OffloadPlugin (two plugins reading one switch)."""

    @warcore.hookimpl
    def warcore_engine_flags(self) -> list[FlagSpec]:
        return [FlagSpec("wctest_my_offload", bool, False, "my KV offloader is on")]


class ClashingFlagPlugin:
    @warcore.hookimpl
    def warcore_engine_flags(self) -> list[FlagSpec]:
        return [FlagSpec("wctest_my_offload", str, "off", "a different meaning")]


class BrokenFlagPlugin:
    @warcore.hookimpl
    def warcore_engine_flags(self) -> list[object]:
        return ["not a FlagSpec"]


# -- the command line ----------------------------------------------------------------------


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ["matrix"],
        ["run", "--requests", "1", "--device", "sim"],
        ["sanitize", "--backend", "torch_native", "--requests", "1"],
    ],
)
def test_an_unknown_flag_is_exit_2_naming_it_and_the_valid_ones(
    command: list[str], clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*command, "--flag", TYPO]) == 2
    line = _one_error_line(capsys)
    assert repr(TYPO) in line
    for name in CORE_FLAGS:
        assert name in line, line
    assert "did you mean 'nccl_allgather_in_overlap'" in line


@pytest.mark.parametrize("value", ["maybe", "2", "", "tru"])
def test_a_boolean_flag_accepts_only_the_documented_spellings(
    value: str, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["matrix", "--flag", f"hicache={value}"]) == 2
    line = _one_error_line(capsys)
    assert "hicache" in line and repr(value) in line
    assert "1/0, true/false, yes/no, on/off" in line


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("hicache", True),
        ("hicache=yes", True),
        ("hicache=ON", True),
        ("hicache=1", True),
        ("hicache=off", False),
        ("hicache=0", False),
        ("hybrid_decode_backend=torch_native", "torch_native"),
    ],
)
def test_flag_values_are_parsed_by_the_flags_kind(
    text: str, value: object, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["matrix", "--json", "--flag", text]) == 0
    flags = json.loads(capsys.readouterr().out)["flags"]
    assert flags == {text.partition("=")[0]: value}
    assert type(next(iter(flags.values()))) is type(value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1_000", "plain decimal digits"),
        (" 5", "plain decimal digits"),
        ("5 ", "plain decimal digits"),
        ("\u0663", "plain decimal digits"),  # ARABIC-INDIC DIGIT THREE: int() takes it
        ("+5", "plain decimal digits"),
        ("0x10", "plain decimal digits"),
        ("65", "from 1 to 64"),
        ("0", "from 1 to 64"),
        ("9" * 5000, "from 1 to 64"),  # past int()'s digit limit: still the range's line
    ],
)
def test_an_int_flag_takes_plain_decimal_digits_within_its_declared_range(
    value: str,
    says: str,
    clean_env: None,
    register_for_test: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    register_for_test(OffloadPlugin())
    assert cli.main(["matrix", "--json", "--flag", f"wctest_my_offload_chunks={value}"]) == 2
    line = _one_error_line(capsys)
    assert "wctest_my_offload_chunks" in line and says in line, line
    assert cli.main(["matrix", "--json", "--flag", "wctest_my_offload_chunks=64"]) == 0
    assert json.loads(capsys.readouterr().out)["flags"] == {"wctest_my_offload_chunks": 64}


def test_an_int_flags_range_is_declared_and_checked_in_the_api() -> None:
    chunks = FlagSpec("wctest_chunks", int, 4, "chunks", bounds=(1, 64))
    assert chunks.bounds == (1, 64)
    assert FlagSpec("wctest_n", int, 4, "n").bounds == (0, 2**31 - 1)  # the default range
    with pytest.raises(ValueError, match="'wctest_n'.*default 100.*1 to 64"):
        FlagSpec("wctest_n", int, 100, "n", bounds=(1, 64))
    with pytest.raises(ValueError, match="'wctest_b'.*bounds.*int flag"):
        FlagSpec("wctest_b", bool, False, "b", bounds=(0, 1))
    pm = fresh_manager(OffloadPlugin())
    with pytest.raises(ValueError, match="'wctest_my_offload_chunks'.*from 1 to 64, got 10000"):
        Engine(EngineConfig(flags=(("wctest_my_offload_chunks", 10_000),)), device="sim", pm=pm)


def test_a_str_flag_without_a_value_is_an_error(
    clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["matrix", "--flag", "hybrid_decode_backend"]) == 2
    line = _one_error_line(capsys)
    assert "hybrid_decode_backend" in line and "needs a value" in line


# -- the registry and the hook -------------------------------------------------------------


def test_the_registry_holds_the_core_flags_and_the_plugins_own() -> None:
    registry = get_registry(fresh_manager(OffloadPlugin()))
    assert {name: offer.spec for name, offer in registry.flags.items()} == {
        **CORE_FLAGS,
        "wctest_my_offload": FlagSpec("wctest_my_offload", bool, False, "my KV offloader is on"),
        "wctest_my_offload_chunks": FlagSpec(
            "wctest_my_offload_chunks", int, 4, "chunks my offloader keeps on the host", (1, 64)
        ),
    }
    assert registry.flags["hicache"].plugin == "warcore"
    assert registry.flags["wctest_my_offload"].plugin == "OffloadPlugin"
    assert not registry.problems


def test_two_plugins_may_declare_the_same_flag_but_not_two_meanings() -> None:
    same = get_registry(fresh_manager(OffloadPlugin(), SameFlagPlugin()))
    assert "wctest_my_offload" in same.flags and not same.problems
    clash = get_registry(fresh_manager(OffloadPlugin(), ClashingFlagPlugin()))
    assert "wctest_my_offload" not in clash.flags
    [problem] = clash.problems
    assert "flag 'wctest_my_offload'" in problem and "OffloadPlugin" in problem
    assert "ClashingFlagPlugin" in problem
    with pytest.raises(ValueError, match="flag 'wctest_my_offload' is declared differently"):
        clash.flag("wctest_my_offload")
    with pytest.raises(ValueError, match="flag 'wctest_my_offload' is declared differently"):
        clash.check_flags((("wctest_my_offload", True),))
    from warcore.audit.matrix import find_problems

    pm = fresh_manager(OffloadPlugin(), ClashingFlagPlugin())
    assert any("flag 'wctest_my_offload'" in p for p in find_problems(pm))  # warcore check says so


def test_a_plugin_cannot_redefine_a_core_flag() -> None:
    class Redefines:
        @warcore.hookimpl
        def warcore_engine_flags(self) -> list[FlagSpec]:
            return [FlagSpec("hicache", int, 0, "not a bool")]

    registry = get_registry(fresh_manager(Redefines()))
    assert registry.flags["hicache"].spec == CORE_FLAGS["hicache"]
    assert registry.flags["hicache"].plugin == "warcore"
    assert any("'hicache'" in p and "Redefines" in p for p in registry.problems)


def test_a_broken_flag_hook_is_a_problem_and_the_others_stay() -> None:
    registry = get_registry(fresh_manager(BrokenFlagPlugin(), OffloadPlugin()))
    assert "wctest_my_offload" in registry.flags and "hicache" in registry.flags
    assert any("warcore_engine_flags" in p for p in registry.problems)


def test_the_hookspec_documents_itself_with_an_example_plugin() -> None:
    spec = WarcorePluginManager(builtins=False).hook.warcore_engine_flags.spec
    doc = (spec.function.__doc__ if spec is not None else None) or ""
    assert "Called" in doc and "FlagSpec" in doc and "Example plugin" in doc
    assert "@warcore.hookimpl" in doc


def test_flagspec_is_public() -> None:
    assert warcore.FlagSpec is FlagSpec and "FlagSpec" in warcore.__all__


# -- the Python API ------------------------------------------------------------------------


def test_the_engine_rejects_an_unknown_flag_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=rf"unknown engine flag '{TYPO}'.*valid: .*hicache"):
        Engine(EngineConfig(flags=((TYPO, True),)), device="sim")


@pytest.mark.parametrize(
    ("name", "value"),
    [("hicache", "yes"), ("hicache", 1), ("hybrid_decode_backend", True), ("lmcache", None)],
)
def test_the_engine_rejects_a_wrongly_typed_flag_naming_it(name: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError), match=repr(name)):
        Engine(EngineConfig(flags=((name, value),)), device="sim")  # type: ignore[arg-type]


def test_the_engine_accepts_a_plugins_own_flags() -> None:
    pm = fresh_manager(OffloadPlugin())
    config = EngineConfig(flags=(("wctest_my_offload", True), ("wctest_my_offload_chunks", 8)))
    with Engine(config, device="sim", pm=pm) as engine:
        assert engine.context.flag("wctest_my_offload") is True
    with pytest.raises(ValueError, match="'wctest_my_offload_chunks'.*int"):
        Engine(EngineConfig(flags=(("wctest_my_offload_chunks", "8"),)), device="sim", pm=pm)
    # Without the plugin, its flag is unknown.
    with pytest.raises(ValueError, match="unknown engine flag 'wctest_my_offload'"):
        Engine(EngineConfig(flags=(("wctest_my_offload", True),)), device="sim", pm=fresh_manager())


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"hicahce": True}, "unknown engine flag 'hicahce' (did you mean 'hicache'?)"),
        ({"hicache": "false"}, "engine flag 'hicache' is a bool flag; got 'false'"),
        ({"hicache": 1}, "engine flag 'hicache' is a bool flag; got 1"),
        ({"hybrid_decode_backend": "nope"}, "flag hybrid_decode_backend='nope': unknown backend"),
        ({"layer_hybrid_backends": "layer_hybrid"}, "cannot be its own child"),
    ],
)
def test_the_matrix_api_checks_flags_as_the_command_line_does(
    flags: dict[str, object], says: str
) -> None:
    """A misspelt ``hicahce`` once gave a cell recorded at pre_replay (where ``hicache`` vetoes
    the fast path) and ``'false'`` read as on: the API refuses what ``--flag`` refuses."""
    from warcore.audit.matrix import build_matrix, model_differences

    pm = fresh_manager()
    with pytest.raises(ValueError) as info:
        build_matrix(pm, flags, backends=["torch_native"])  # type: ignore[arg-type]
    assert says in str(info.value)
    with pytest.raises(ValueError, match=re.escape(says)):
        model_differences(pm, flags)  # type: ignore[arg-type]
    assert build_matrix(pm, {"hicache": False}, backends=["torch_native"])  # a right one runs


# -- the documentation ---------------------------------------------------------------------


def test_the_docs_document_every_core_flag_in_a_table() -> None:
    page = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    row = re.compile(r"^\| `([a-z_]+)` \| (?:bool|int|str) \|", re.M)
    rows = {m.group(1) for m in row.finditer(page)}
    assert set(CORE_FLAGS) <= rows, set(CORE_FLAGS) - rows
