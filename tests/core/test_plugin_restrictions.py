"""Which plugin code warcore runs, and what it says about it.

The environment's restrictions: the allowlist (``WARCORE_PLUGINS``), the block list
(``WARCORE_DISABLE_PLUGINS``), force-coarse; the allowlist and block list by identity
(distribution and entry point), an allowlist that names nothing, every command honouring the
restrictions (the start-up benchmark's children too). What warcore says about the code it
runs: hooks that would silently do nothing, slow plugins, and the docs' statement of the
rule. Fake plugins are real distributions on ``sys.path`` (the ``fake`` fixture,
``_support/fake_dists.py``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from _support import ROOT, fresh_manager, plugin_info, plugin_infos
from _support.fake_dists import DECLARES, REAL_PLUGINS, FakeDists, marks, run_warcore

import warcore
from warcore.core import (
    BUILTIN_PLUGIN_NAME,
    BoundaryContext,
    Execution,
    ForwardMode,
    LoaderConfig,
    PluginInfo,
    RecordPoint,
    RunnerKind,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
    get_registry,
)

# what is installed is what these check: every plugin-matrix cell runs them
pytestmark = pytest.mark.installed


def _imports(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


OFFERS_BACKEND = """
import warcore


def _make(**kwargs):
    raise AssertionError("never built")


@warcore.hookimpl
def warcore_attention_backends():
    return [warcore.BackendSpec({name!r}, _make, "fake")]
"""


# -- the environment controls -----------------------------------------------------------------


@pytest.mark.plugins()
def test_empty_allowlist_loads_none(fake: FakeDists, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = fake.root / "imported.txt"
    fake.add("wctest_spy", f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("WARCORE_PLUGINS", "")
    pm = get_plugin_manager()  # the process-wide manager, built from the environment
    active = {i.name for i in pm.plugin_infos if i.status == "active"}
    assert active == {"warcore"}  # the core's own built-ins only
    for name in REAL_PLUGINS | {"wctest_spy"}:
        assert plugin_info(pm, name).status == "disabled"
        assert "WARCORE_PLUGINS" in (plugin_info(pm, name).error or "")
    assert not marker.exists()
    assert "trtllm_mha" not in get_registry(pm).backends


@pytest.mark.plugins()
def test_allowlist_matches_entry_point_or_distribution_names(fake: FakeDists) -> None:
    fake.add("wctest_good", DECLARES.format(boundary="PRE_REPLAY"), dist="warcore-fake-good")
    pm = fresh_manager(
        config=LoaderConfig.from_env({"WARCORE_PLUGINS": "warcore_fake_good, dflash, nosuch"})
    )
    assert plugin_info(pm, "wctest_good").status == "active"  # by distribution name, normalised
    assert plugin_info(pm, "dflash").status == "active"  # by entry-point name
    assert plugin_info(pm, "trtllm_mha").status == "disabled"
    assert pm.unknown_allowlist_names == ("nosuch",)


@pytest.mark.plugins()
def test_blocked_plugin_is_never_imported(fake: FakeDists) -> None:
    marker = fake.root / "imported.txt"
    module = fake.add(
        "wctest_blocked", f"open({str(marker)!r}, 'w').close()\nraise RuntimeError('imported!')\n"
    )
    for blocked in ("wctest_blocked", "warcore-fake-blocked"):  # entry-point or distribution name
        pm = fresh_manager(
            config=LoaderConfig.from_env({"WARCORE_DISABLE_PLUGINS": f"{blocked},deepseek_v4"})
        )
        info = plugin_info(pm, "wctest_blocked")
        assert info.status == "disabled" and "WARCORE_DISABLE_PLUGINS" in (info.error or "")
        assert plugin_info(pm, "deepseek_v4").status == "disabled"
        assert plugin_info(pm, "trtllm_mha").status == "active"
    assert not marker.exists()
    assert module not in sys.modules


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WARCORE_STRICT_PLUGINS", "maybe"),
        ("WARCORE_FORCE_COARSE", "2"),
        ("WARCORE_PLUGINS", "good plugin"),
        ("WARCORE_DISABLE_PLUGINS", "a;b"),
    ],
)
def test_malformed_environment_is_an_error_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        LoaderConfig.from_env({variable: value})


def test_force_coarse_makes_every_decision_none(fake: FakeDists) -> None:
    fake.add("wctest_good", DECLARES.format(boundary="PRE_REPLAY"))
    pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_FORCE_COARSE": "1"}))
    # Plugins still load; nothing publishes.
    assert plugin_info(pm, "wctest_good").status == "active"
    registry = get_registry(pm)
    cache = get_decision_cache(pm)
    for backend in registry.backends:
        for algorithm in registry.algorithms:
            for kind in RunnerKind:
                for mode in ForwardMode:
                    for execution in Execution:
                        key = (kind, backend, mode, BoundaryContext(algorithm), execution)
                        decision = cache[key]
                        assert decision.record_point is RecordPoint.NONE, key
                        assert decision.source == "forced-coarse", key


# -- allowlist and block list by identity -----------------------------------------------------


@pytest.fixture
def hijack(fake: FakeDists) -> Path:
    """A distribution ``aaa-hijack`` (sorted before ``warcore-dflash``) that exports an entry
    point called ``dflash`` too; its module marks a file when imported."""
    marker = fake.root / "hijack-imported.txt"
    fake.add("dflash", marks(marker), dist="aaa-hijack", module="_wcfake_hijack")
    return marker


def _dflash_infos(pm: WarcorePluginManager) -> dict[str, PluginInfo]:
    return {i.distribution or "": i for i in plugin_infos(pm, "dflash")}


@pytest.mark.plugins("dflash")
@pytest.mark.parametrize(
    "allow", ["warcore-dflash", "warcore_dflash", "warcore-dflash:dflash", "Warcore.DFlash:dflash"]
)
def test_allowlist_by_distribution_admits_the_genuine_plugin_only(
    fake: FakeDists, hijack: Path, allow: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_PLUGINS": allow}))
    infos = _dflash_infos(pm)
    assert infos["warcore-dflash"].status == "active"
    assert infos["aaa-hijack"].status == "disabled"
    assert "WARCORE_PLUGINS" in (infos["aaa-hijack"].error or "")
    assert _imports(hijack) == 0
    assert pm.unknown_allowlist_names == ()
    assert not [r for r in caplog.records if "WARCORE_PLUGINS" in r.getMessage()]
    assert "dflash" in get_registry(pm).algorithms


@pytest.mark.plugins("dflash")
def test_an_entry_point_name_two_distributions_offer_admits_neither(
    fake: FakeDists, hijack: Path
) -> None:
    pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_PLUGINS": "dflash"}))
    infos = _dflash_infos(pm)
    assert infos["warcore-dflash"].status == "disabled"
    assert infos["aaa-hijack"].status == "disabled"
    assert _imports(hijack) == 0
    assert len(pm.allowlist_problems) == 1
    problem = pm.allowlist_problems[0]
    assert "'dflash'" in problem and "aaa-hijack" in problem and "warcore-dflash" in problem
    result = run_warcore("check", env=fake.env(WARCORE_PLUGINS="dflash"))
    assert result.returncode == 1
    assert any(
        "aaa-hijack" in line and "warcore-dflash" in line for line in result.stdout.split("\n")
    )
    assert _imports(hijack) == 0


@pytest.mark.plugins("dflash")
def test_an_unrestricted_duplicate_loads_neither(fake: FakeDists, hijack: Path) -> None:
    pm = fresh_manager()
    infos = _dflash_infos(pm)
    assert infos["warcore-dflash"].status == "failed"
    assert infos["aaa-hijack"].status == "failed"
    assert "aaa-hijack" in (infos["warcore-dflash"].error or "")
    assert _imports(hijack) == 0
    assert "dflash" not in get_registry(pm).algorithms


@pytest.mark.plugins("dflash")
@pytest.mark.parametrize("block", ["aaa-hijack", "aaa-hijack:dflash"])
def test_blocking_the_impostor_lets_the_genuine_plugin_load(
    fake: FakeDists, hijack: Path, block: str
) -> None:
    pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_DISABLE_PLUGINS": block}))
    infos = _dflash_infos(pm)
    assert infos["warcore-dflash"].status == "active"
    assert infos["aaa-hijack"].status == "disabled"
    assert _imports(hijack) == 0


@pytest.mark.plugins("dflash")
def test_blocking_an_ambiguous_entry_point_name_blocks_every_holder(
    fake: FakeDists, hijack: Path
) -> None:
    pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_DISABLE_PLUGINS": "dflash"}))
    infos = _dflash_infos(pm)
    assert {i.status for i in infos.values()} == {"disabled"}
    assert _imports(hijack) == 0


@pytest.mark.plugins("dflash")
def test_distribution_named_like_an_entry_point_is_ambiguous(fake: FakeDists) -> None:
    """A distribution called ``dflash`` does not get in on the genuine plugin's name."""
    marker = fake.root / "imported.txt"
    fake.add("wctest_evil", marks(marker), dist="dflash")
    pm = fresh_manager(config=LoaderConfig.from_env({"WARCORE_PLUGINS": "dflash"}))
    assert plugin_info(pm, "wctest_evil").status == "disabled"
    assert plugin_info(pm, "dflash").status == "disabled"
    assert _imports(marker) == 0 and pm.allowlist_problems


def test_allowlist_entries_with_a_colon_are_validated() -> None:
    assert LoaderConfig.from_env({"WARCORE_PLUGINS": "a-b:c_d"}).allowlist == {"a-b:c_d"}
    for bad in ("a:", ":b", "a:b:c"):
        with pytest.raises(ValueError, match="WARCORE_PLUGINS"):
            LoaderConfig.from_env({"WARCORE_PLUGINS": bad})


@pytest.mark.parametrize(("kind", "name"), [("backend", "torch_native"), ("algorithm", "eagle")])
def test_a_plugin_offering_a_core_name_is_an_error_and_the_builtin_stays(
    fake: FakeDists, kind: str, name: str
) -> None:
    hook = "warcore_attention_backends" if kind == "backend" else "warcore_speculative_algorithms"
    spec = (
        f"warcore.BackendSpec({name!r}, _make, 'fake')"
        if kind == "backend"
        else f"warcore.AlgorithmSpec({name!r}, 'none', 'fake')"
    )
    fake.add(
        "wctest_squatter",
        f"""
        import warcore


        def _make(**kwargs):
            raise AssertionError("never built")


        @warcore.hookimpl
        def {hook}():
            return [{spec}]
        """,
    )
    registry = get_registry(fresh_manager())
    table = registry.backends if kind == "backend" else registry.algorithms
    assert table[name].plugin == BUILTIN_PLUGIN_NAME
    (problem,) = [p for p in registry.problems if "wctest_squatter" in p]
    assert f"{kind} {name!r}" in problem and "core" in problem
    result = run_warcore("check", env=fake.env())
    assert result.returncode == 1
    assert any("'wctest_squatter" in line and name in line for line in result.stdout.splitlines())


def test_an_entry_point_named_like_the_core_plugin_fails(fake: FakeDists) -> None:
    marker = fake.root / "imported.txt"
    fake.add(BUILTIN_PLUGIN_NAME, marks(marker), dist="warcore-squat")
    pm = fresh_manager()
    (squat,) = [
        i for i in plugin_infos(pm, BUILTIN_PLUGIN_NAME) if i.distribution == "warcore-squat"
    ]
    assert squat.status == "failed" and "core" in (squat.error or "")
    assert _imports(marker) == 0


# -- an allowlist that names nothing ----------------------------------------------------------


@pytest.mark.parametrize("value", [",,,", " , ", ","])
def test_an_allowlist_naming_nothing_is_malformed(fake: FakeDists, value: str) -> None:
    with pytest.raises(ValueError, match="WARCORE_PLUGINS"):
        LoaderConfig.from_env({"WARCORE_PLUGINS": value})
    result = run_warcore("check", env=fake.env(WARCORE_PLUGINS=value))
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert "WARCORE_PLUGINS" in line


def test_an_empty_allowlist_still_loads_none() -> None:
    assert LoaderConfig.from_env({"WARCORE_PLUGINS": ""}).allowlist == frozenset()
    assert LoaderConfig.from_env({"WARCORE_PLUGINS": "  "}).allowlist == frozenset()


# -- every command honours the restrictions ---------------------------------------------------


@pytest.mark.plugin_agnostic
@pytest.mark.parametrize(
    "env",
    [
        {"WARCORE_DISABLE_PLUGINS": "wctest_spy"},
        {"WARCORE_PLUGINS": "trtllm_mha"},
        {"WARCORE_PLUGINS": ""},
    ],
)
def test_bench_startup_children_never_import_a_blocked_plugin(
    fake: FakeDists, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    from warcore.bench import startup as bench_startup

    marker = fake.root / "imported.txt"
    fake.add("wctest_spy", marks(marker))
    monkeypatch.setenv("PYTHONPATH", fake.env()["PYTHONPATH"])
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(bench_startup, "_CHILD", bench_startup._CHILD.replace("import torch", ""))
    result = bench_startup.measure(repeat=1, plugins=2)
    assert _imports(marker) == 0
    settings = result["settings"]
    # The generated plugins are the benchmark's own: they are admitted and load.
    assert settings["installed+2"]["active_plugins"] == settings["installed"]["active_plugins"] + 2
    assert result["restrictions"] == env


@pytest.mark.plugin_agnostic
@pytest.mark.parametrize(
    "env",
    [{"WARCORE_DISABLE_PLUGINS": "warcore-fake-spy:wctest_spy"}, {"WARCORE_PLUGINS": "dflash"}],
)
def test_no_command_imports_a_blocked_plugin(
    fake: FakeDists, tmp_path: Path, env: dict[str, str]
) -> None:
    marker = fake.root / "imported.txt"
    fake.add("wctest_spy", marks(marker) + OFFERS_BACKEND.format(name="wctest_spy"))
    engine = ["--device", "sim", "--backend", "torch_native", "--requests", "2"]
    commands = [
        ["plugins"],
        ["plugins", "--json"],
        ["matrix"],
        ["check"],
        ["run", *engine, "--no-verify", "--progress", "never"],
        ["sanitize", *engine],
        ["bench", "lookup", "--number", "10", "--repeat", "1", "--json", str(tmp_path / "l.json")],
    ]
    for command in commands:
        result = run_warcore(*command, env=fake.env(**env), timeout=300)
        assert result.returncode in (0, 1), (command, result.stderr)
        assert _imports(marker) == 0, command
    assert run_warcore("plugins", env=fake.env()).returncode == 0
    assert _imports(marker) == 1  # the spy does mark an import when it is allowed


def test_no_warcore_subprocess_drops_the_restrictions() -> None:
    """Every child interpreter warcore starts is the start-up benchmark's (checked above), or
    ``warcore release``'s ``python -m pip download``, which loads no warcore plugin and gets
    this process's environment as it is (only its temporary folder moved)."""
    root = Path(warcore.__file__).parent
    launches = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "sys.executable" in path.read_text(encoding="utf-8")
    )
    assert launches == ["bench/startup.py", "integration/wheel.py"], launches
    fetch = (root / "integration" / "wheel.py").read_text(encoding="utf-8")
    assert '"-m", "pip", "download"' in fetch and "env = {**os.environ, " in fetch


# -- hooks that would silently do nothing -----------------------------------------------------


def test_unmarked_or_misspelled_hook_functions_fail_the_plugin_naming_them(
    fake: FakeDists,
) -> None:
    fake.add(
        "wctest_unmarked",
        """
        import warcore


        def warcore_is_war_publish_phase(algorithm, forward_mode):  # no @warcore.hookimpl
            return True


        @warcore.hookimpl
        def warcore_speculative_algorithms():
            return []
        """,
    )
    fake.add(
        "wctest_typo_unmarked",
        """
        def warcore_shared_read_boundry(backend, forward_mode, context):
            return None
        """,
    )
    pm = fresh_manager()
    unmarked = plugin_info(pm, "wctest_unmarked")
    assert unmarked.status == "failed"
    assert "'warcore_is_war_publish_phase'" in (unmarked.error or "")
    assert "hookimpl" in (unmarked.error or "")
    typo = plugin_info(pm, "wctest_typo_unmarked")
    assert typo.status == "failed"
    assert "'warcore_shared_read_boundry'" in (typo.error or "")
    assert "warcore_shared_read_boundary" in (typo.error or "")  # the suggestion
    assert not pm.has_plugin("wctest_unmarked") and not pm.has_plugin("wctest_typo_unmarked")


def test_a_plugin_with_no_hook_is_a_warning_and_a_check_problem(fake: FakeDists) -> None:
    fake.add("wctest_inert", "X = 1\n")
    pm = fresh_manager()
    inert = plugin_info(pm, "wctest_inert")
    assert inert.status == "active" and inert.hooks == ()
    assert any("no hook" in w for w in inert.warnings)
    data = fake.plugins_json()
    (entry,) = [p for p in data["plugins"] if p["name"] == "wctest_inert"]
    assert entry["warnings"] and "no hook" in entry["warnings"][0]
    table = run_warcore("plugins", env=fake.env())
    assert any("wctest_inert" in line and "no hook" in line for line in table.stdout.splitlines())
    result = run_warcore("check", env=fake.env())
    assert result.returncode == 1
    assert any(
        "'wctest_inert'" in line and "no hook" in line for line in result.stdout.splitlines()
    )


# -- slow plugins are visible -----------------------------------------------------------------


def test_load_time_is_measured_and_a_slow_plugin_is_warned_about(
    fake: FakeDists, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add(
        "wctest_sluggish", "import time\ntime.sleep(0.2)\n" + DECLARES.format(boundary="PRE_REPLAY")
    )
    fake.add("wctest_quick", DECLARES.format(boundary="PRE_REPLAY"))
    monkeypatch.setattr(WarcorePluginManager, "SLOW_PLUGIN_SECONDS", 0.1)
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        pm = fresh_manager()
    slow, quick = plugin_info(pm, "wctest_sluggish"), plugin_info(pm, "wctest_quick")
    assert slow.load_ms is not None and slow.load_ms >= 200
    assert quick.load_ms is not None and quick.load_ms < 100
    assert any("slow" in w for w in slow.warnings) and not quick.warnings
    messages = [r.getMessage() for r in caplog.records if "'wctest_sluggish'" in r.getMessage()]
    assert len(messages) == 1 and "0.1 s" in messages[0], messages
    data = fake.plugins_json()
    assert all(isinstance(p["load_ms"], float) for p in data["plugins"] if p["status"] == "active")
    table = run_warcore("plugins", env=fake.env())
    assert "LOAD MS" in table.stdout.splitlines()[0]


def _install_page() -> str:
    """The docs page on installing and turning plugins on and off."""
    return (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


def test_the_slow_plugin_threshold_is_documented() -> None:
    page = _install_page()
    assert WarcorePluginManager.SLOW_PLUGIN_SECONDS == 1.0
    assert "SLOW_PLUGIN_SECONDS" in page and "1 s" in page


# -- the docs state the rule -------------------------------------------------------------------


def test_the_docs_state_the_matching_rule_and_what_commands_do() -> None:
    section = _install_page().split("## What code warcore loads", 1)[1].split("\n## ", 1)[0]
    for phrase in ("DIST:EP", "exactly one", "bench startup", "never imported", "registered_by"):
        assert phrase in section, phrase
