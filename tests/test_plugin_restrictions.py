"""Which plugin code warcore runs, and what it says about it (issue 11, plugin loading).

Re-entrant manager use at import, the allowlist and block list by identity (distribution and
entry point), restrictions honoured by every command (the start-up benchmark's children too),
hooks that would silently do nothing, slow plugins, runtime registrations, logging once, and a
quiet ``check``. Fake plugins are real distributions on ``sys.path`` (see ``_fake_dists``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_dists import DECLARES, REAL_PLUGINS, FakeDists, fake_dists, marks, run_warcore

import warcore
from warcore.core import (
    BUILTIN_PLUGIN_NAME,
    LoaderConfig,
    PluginInfo,
    WarcorePluginManager,
    get_plugin_manager,
    get_registry,
)
from warcore.core import _manager as manager_module


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDists]:
    yield from fake_dists(tmp_path, monkeypatch)


def _load(config: LoaderConfig | None = None) -> WarcorePluginManager:
    pm = WarcorePluginManager(config or LoaderConfig())
    pm.load_entry_points()
    return pm


def _infos(pm: WarcorePluginManager, name: str) -> list[PluginInfo]:
    return [i for i in pm.plugin_infos if i.name == name]


def _info(pm: WarcorePluginManager, name: str) -> PluginInfo:
    matches = _infos(pm, name)
    assert len(matches) == 1, pm.plugin_infos
    return matches[0]


def _plugins_json(fake: FakeDists, **env: str) -> dict[str, Any]:
    result = run_warcore("plugins", "--json", env=fake.env(**env))
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


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


# -- 1. re-entrant use of the process-wide manager at import ---------------------------------


@pytest.mark.plugins()
@pytest.mark.parametrize(
    "body",
    [
        "import warcore\nwarcore.get_plugin_manager()\n",
        "import warcore\nwarcore.reset_plugin_manager()\n",
        # Swallowing the error does not make the plugin load.
        "import warcore\ntry:\n    warcore.get_plugin_manager()\nexcept Exception:\n    pass\n",
    ],
    ids=["get", "reset", "swallowed"],
)
def test_manager_use_at_import_fails_that_plugin_instead_of_hanging(
    fake: FakeDists, body: str
) -> None:
    fake.add("wctest_reenter", body)
    fake.add("wctest_reenter_then", DECLARES.format(boundary="PRE_REPLAY"))
    result = run_warcore("plugins", "--json", env=fake.env(), timeout=60)
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert plugins["wctest_reenter"]["status"] == "failed"
    error = plugins["wctest_reenter"]["error"]
    assert "'wctest_reenter'" in error and "while it was being imported" in error, error
    assert "_plugin_manager()" in error
    for name in [*REAL_PLUGINS, "wctest_reenter_then"]:  # the last sorts after it: went on
        assert plugins[name]["status"] == "active"
    assert "'wctest_reenter'" in result.stderr  # the one load warning


def test_another_thread_waits_for_the_manager_being_built(fake: FakeDists) -> None:
    fake.add(
        "wctest_spawns",
        """
        import threading

        import warcore

        results = []
        thread = threading.Thread(target=lambda: results.append(warcore.get_plugin_manager()))
        thread.start()
        thread.join(0.3)
        waited = thread.is_alive()  # it cannot have a manager before loading ends
        """,
    )
    pm = get_plugin_manager()
    module = pytest.importorskip("_wcfake_spawns")
    module.thread.join(10)
    assert module.waited and not module.thread.is_alive()
    assert module.results == [pm]
    assert _info(pm, "wctest_spawns").status == "active"


# -- 2. allowlist and block list by identity --------------------------------------------------


@pytest.fixture
def hijack(fake: FakeDists) -> Path:
    """A distribution ``aaa-hijack`` (sorted before ``warcore-dflash``) that exports an entry
    point called ``dflash`` too; its module marks a file when imported."""
    marker = fake.root / "hijack-imported.txt"
    fake.add("dflash", marks(marker), dist="aaa-hijack", module="_wcfake_hijack")
    return marker


def _dflash_infos(pm: WarcorePluginManager) -> dict[str, PluginInfo]:
    return {i.distribution or "": i for i in _infos(pm, "dflash")}


@pytest.mark.plugins("dflash")
@pytest.mark.parametrize(
    "allow", ["warcore-dflash", "warcore_dflash", "warcore-dflash:dflash", "Warcore.DFlash:dflash"]
)
def test_allowlist_by_distribution_admits_the_genuine_plugin_only(
    fake: FakeDists, hijack: Path, allow: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        pm = _load(LoaderConfig.from_env({"WARCORE_PLUGINS": allow}))
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
    pm = _load(LoaderConfig.from_env({"WARCORE_PLUGINS": "dflash"}))
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
    pm = _load()
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
    pm = _load(LoaderConfig.from_env({"WARCORE_DISABLE_PLUGINS": block}))
    infos = _dflash_infos(pm)
    assert infos["warcore-dflash"].status == "active"
    assert infos["aaa-hijack"].status == "disabled"
    assert _imports(hijack) == 0


@pytest.mark.plugins("dflash")
def test_blocking_an_ambiguous_entry_point_name_blocks_every_holder(
    fake: FakeDists, hijack: Path
) -> None:
    pm = _load(LoaderConfig.from_env({"WARCORE_DISABLE_PLUGINS": "dflash"}))
    infos = _dflash_infos(pm)
    assert {i.status for i in infos.values()} == {"disabled"}
    assert _imports(hijack) == 0


@pytest.mark.plugins("dflash")
def test_distribution_named_like_an_entry_point_is_ambiguous(fake: FakeDists) -> None:
    """A distribution called ``dflash`` does not get in on the genuine plugin's name."""
    marker = fake.root / "imported.txt"
    fake.add("wctest_evil", marks(marker), dist="dflash")
    pm = _load(LoaderConfig.from_env({"WARCORE_PLUGINS": "dflash"}))
    assert _info(pm, "wctest_evil").status == "disabled"
    assert _info(pm, "dflash").status == "disabled"
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
    registry = get_registry(_load())
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
    pm = _load()
    (squat,) = [i for i in _infos(pm, BUILTIN_PLUGIN_NAME) if i.distribution == "warcore-squat"]
    assert squat.status == "failed" and "core" in (squat.error or "")
    assert _imports(marker) == 0


# -- 3. every command honours the restrictions ------------------------------------------------


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
    """Every child interpreter warcore starts is the start-up benchmark's (checked above)."""
    root = Path(warcore.__file__).parent
    launches = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "sys.executable" in path.read_text(encoding="utf-8")
    )
    assert launches == ["bench/startup.py"], launches


# -- 4. hooks that would silently do nothing --------------------------------------------------


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
    pm = _load()
    unmarked = _info(pm, "wctest_unmarked")
    assert unmarked.status == "failed"
    assert "'warcore_is_war_publish_phase'" in (unmarked.error or "")
    assert "hookimpl" in (unmarked.error or "")
    typo = _info(pm, "wctest_typo_unmarked")
    assert typo.status == "failed"
    assert "'warcore_shared_read_boundry'" in (typo.error or "")
    assert "warcore_shared_read_boundary" in (typo.error or "")  # the suggestion
    assert not pm.has_plugin("wctest_unmarked") and not pm.has_plugin("wctest_typo_unmarked")


def test_a_plugin_with_no_hook_is_a_warning_and_a_check_problem(fake: FakeDists) -> None:
    fake.add("wctest_inert", "X = 1\n")
    pm = _load()
    inert = _info(pm, "wctest_inert")
    assert inert.status == "active" and inert.hooks == ()
    assert any("no hook" in w for w in inert.warnings)
    data = _plugins_json(fake)
    (entry,) = [p for p in data["plugins"] if p["name"] == "wctest_inert"]
    assert entry["warnings"] and "no hook" in entry["warnings"][0]
    table = run_warcore("plugins", env=fake.env())
    assert any("wctest_inert" in line and "no hook" in line for line in table.stdout.splitlines())
    result = run_warcore("check", env=fake.env())
    assert result.returncode == 1
    assert any(
        "'wctest_inert'" in line and "no hook" in line for line in result.stdout.splitlines()
    )


# -- 5. slow plugins are visible --------------------------------------------------------------


def test_load_time_is_measured_and_a_slow_plugin_is_warned_about(
    fake: FakeDists, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add(
        "wctest_sluggish", "import time\ntime.sleep(0.2)\n" + DECLARES.format(boundary="PRE_REPLAY")
    )
    fake.add("wctest_quick", DECLARES.format(boundary="PRE_REPLAY"))
    monkeypatch.setattr(manager_module, "SLOW_PLUGIN_SECONDS", 0.1)
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        pm = _load()
    slow, quick = _info(pm, "wctest_sluggish"), _info(pm, "wctest_quick")
    assert slow.load_ms is not None and slow.load_ms >= 200
    assert quick.load_ms is not None and quick.load_ms < 100
    assert any("slow" in w for w in slow.warnings) and not quick.warnings
    messages = [r.getMessage() for r in caplog.records if "'wctest_sluggish'" in r.getMessage()]
    assert len(messages) == 1 and "0.1 s" in messages[0], messages
    data = _plugins_json(fake)
    assert all(isinstance(p["load_ms"], float) for p in data["plugins"] if p["status"] == "active")
    table = run_warcore("plugins", env=fake.env())
    assert "LOAD MS" in table.stdout.splitlines()[0]


def _install_page() -> str:
    """The docs page on installing and turning plugins on and off."""
    root = next(p for p in Path(__file__).resolve().parents if (p / "mkdocs.yml").is_file())
    return (root / "docs" / "install.md").read_text(encoding="utf-8")


def test_the_slow_plugin_threshold_is_documented() -> None:
    page = _install_page()
    assert manager_module.SLOW_PLUGIN_SECONDS == 1.0
    assert "SLOW_PLUGIN_SECONDS" in page and "1 s" in page


# -- 6. an allowlist that names nothing -------------------------------------------------------


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


# -- 7. runtime registrations are listed with who registered them -----------------------------


@pytest.mark.plugins()
def test_plugins_lists_runtime_registrations_and_who_made_them(fake: FakeDists) -> None:
    fake.add(
        "wctest_outer",
        """
        import warcore


        def _make(**kwargs):
            raise AssertionError("never built")


        class Inner:
            @warcore.hookimpl
            def warcore_attention_backends(self):
                return [warcore.BackendSpec("wctest_inner_backend", _make, "run-time plugin")]


        @warcore.hookimpl
        def warcore_speculative_algorithms():
            pm = warcore.get_plugin_manager()
            if not pm.has_plugin("wctest_inner"):
                pm.register(Inner(), name="wctest_inner")
            return []
        """,
    )
    data = _plugins_json(fake)
    plugins = {p["name"]: p for p in data["plugins"]}
    assert plugins["wctest_inner"]["registered_by"] == "plugin:wctest_outer"
    assert plugins["wctest_inner"]["status"] == "active"
    assert plugins["wctest_inner"]["hooks"] == ["warcore_attention_backends"]
    assert plugins["wctest_outer"]["registered_by"] == "entry point"
    assert plugins[BUILTIN_PLUGIN_NAME]["registered_by"] == "core"
    for name in REAL_PLUGINS:
        assert plugins[name]["registered_by"] == "entry point"
    matrix = json.loads(run_warcore("matrix", "--json", env=fake.env()).stdout)
    assert "wctest_inner_backend" in {row["backend"] for row in matrix["rows"]}


def test_a_registration_from_elsewhere_is_runtime_and_unregistering_updates_it(
    fake: FakeDists,
) -> None:
    class Loose:
        @warcore.hookimpl
        def warcore_speculative_algorithms(self) -> list[Any]:
            return []

    pm = _load()
    pm.register(Loose(), name="wctest_loose")
    loose = _info(pm, "wctest_loose")
    assert loose.registered_by == "runtime" and loose.status == "active"
    pm.unregister(name="wctest_loose")
    assert _info(pm, "wctest_loose").status == "disabled"


# -- 8. logged once ---------------------------------------------------------------------------

RAISING_HOOKS = """
import warcore


@warcore.hookimpl
def warcore_shared_read_boundary(backend, forward_mode, context):
    raise ValueError("cannot decide")


@warcore.hookimpl
def warcore_is_war_publish_phase(algorithm, forward_mode):
    raise ValueError("cannot decide")


@warcore.hookimpl
def warcore_speculative_algorithms():
    raise ValueError("cannot list")


@warcore.hookimpl
def warcore_attention_backends():
    raise ValueError("cannot offer")


@warcore.hookimpl
def warcore_fast_path_veto(forward_mode, context):
    raise ValueError("cannot veto")


@warcore.hookimpl
def warcore_step_event_owner(algorithm, facts):
    raise ValueError("cannot own")
"""
RAISING = (
    "warcore_shared_read_boundary",
    "warcore_is_war_publish_phase",
    "warcore_speculative_algorithms",
    "warcore_attention_backends",
    "warcore_fast_path_veto",
    "warcore_step_event_owner",
)


@pytest.mark.parametrize("algorithm", ["none", "eagle"])
def test_a_raising_hook_is_logged_once_per_hook_in_a_whole_run(
    fake: FakeDists, algorithm: str
) -> None:
    fake.add("wctest_raiser", RAISING_HOOKS)
    args = ["--device", "sim", "--backend", "torch_native", "--algorithm", algorithm]
    args += ["--requests", "3", "--no-verify", "--progress", "never"]
    result = run_warcore("run", *args, env=fake.env(), timeout=300)
    lines = [line for line in result.stderr.splitlines() if "'wctest_raiser'" in line]
    for hook in RAISING:
        assert len([line for line in lines if hook in line]) == 1, (hook, lines)
    assert len(lines) == len(RAISING), lines


def test_a_failing_spec_hook_is_logged_once_per_reason(
    fake: FakeDists, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add(
        "wctest_flaky",
        """
        import warcore

        calls = []


        @warcore.hookimpl
        def warcore_speculative_algorithms():
            calls.append(1)
            raise ValueError(f"attempt {min(len(calls), 2)}")
        """,
    )
    pm = get_plugin_manager()
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        for _ in range(4):
            pm.cached_registry = None
            get_registry(pm)
    flaky = [r.getMessage() for r in caplog.records if "'wctest_flaky'" in r.getMessage()]
    assert len(flaky) == 2, flaky  # "attempt 1" once, "attempt 2" once


# -- 9. a quiet check -------------------------------------------------------------------------


@pytest.mark.clean_install  # a broken plugin adds its load warning to stderr
def test_check_prints_grouped_lines_and_no_per_cell_warnings(fake: FakeDists) -> None:
    fake.add("wctest_raiser", RAISING_HOOKS)
    result = run_warcore("check", env=fake.env())
    assert result.returncode == 1
    assert any("'wctest_raiser'" in line for line in result.stdout.splitlines())
    assert result.stderr == "", result.stderr
    matrix = run_warcore("matrix", env=fake.env())
    assert matrix.returncode == 0
    assert "failed for" not in matrix.stderr, matrix.stderr


# -- 10. the docs state the rule -------------------------------------------------------------


def test_the_docs_state_the_matching_rule_and_what_commands_do() -> None:
    section = _install_page().split("## What code warcore loads", 1)[1].split("\n## ", 1)[0]
    for phrase in ("DIST:EP", "exactly one", "bench startup", "never imported", "registered_by"):
        assert phrase in section, phrase
