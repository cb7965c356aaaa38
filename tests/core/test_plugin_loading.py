"""Plugin loading and resolution through real entry-point metadata: a plugin that fails to
import, misspells a hook or uses the manager while it is being imported is named and the
others load; failing and disagreeing answers, logged once, and a quiet ``check``; the decision
cache following the plugin set. (Which plugins may load at all:
``test_plugin_restrictions.py``.)

Each fake plugin is a real distribution as far as ``importlib.metadata`` can tell: a module plus
a ``<name>-<version>.dist-info/`` folder with ``METADATA`` and ``entry_points.txt``, in a folder
put on ``sys.path`` (in process) or ``PYTHONPATH`` (``warcore`` run as a subprocess). Nothing
here calls ``register`` to install a plugin; the installed real plugins load alongside.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import subprocess

import pytest
from _support import fresh_manager, plugin_info
from _support.fake_dists import (
    DECLARES,
    RAISES_ON_IMPORT,
    REAL_PLUGINS,
    FakeDists,
    marks,
    run_warcore,
)

from warcore.core import (
    BoundaryContext,
    DuplicateNameError,
    Execution,
    ForwardMode,
    LoaderConfig,
    PluginLoadError,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    WarcorePluginManager,
    get_decision_cache,
    get_plugin_manager,
    get_registry,
    resolve_shared_read_boundary,
    resolve_war_publish_phase,
)

# what is installed is what these check: every plugin-matrix cell runs them
pytestmark = pytest.mark.installed


def _warcore(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_warcore(*args, env=env)


# -- failure isolation ---------------------------------------------------------------------


@pytest.mark.plugins()
def test_plugin_failing_at_import_is_listed_and_others_load(
    fake: FakeDists, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add("wctest_broken", RAISES_ON_IMPORT, dist="warcore-fake-broken", version="0.3")
    fake.add("wctest_good", DECLARES.format(boundary="PRE_REPLAY"))
    with caplog.at_level(logging.WARNING, logger="warcore.plugins"):
        pm = fresh_manager()
    broken = plugin_info(pm, "wctest_broken")
    assert broken.status == "failed"
    assert broken.distribution == "warcore-fake-broken" and broken.version == "0.3"
    assert broken.error == "RuntimeError: boom at import"
    assert plugin_info(pm, "wctest_good").status == "active"  # sorted after it: loading went on
    assert plugin_info(pm, "wctest_good").version == "1.0"
    for name in REAL_PLUGINS:
        assert plugin_info(pm, name).status == "active"
    warnings = [r.getMessage() for r in caplog.records if "'wctest_broken'" in r.getMessage()]
    assert len(warnings) == 1 and "boom at import" in warnings[0]
    resolved = resolve_shared_read_boundary("torch_native", ForwardMode.EXTEND, pm=pm)
    assert (resolved.boundary, resolved.source) == (
        SharedReadBoundary.PRE_REPLAY,
        "plugin:wctest_good",
    )


@pytest.mark.clean_install  # strict mode stops at the installed broken plugin first
def test_strict_mode_raises_naming_the_plugin(fake: FakeDists) -> None:
    fake.add("wctest_broken", RAISES_ON_IMPORT)
    config = LoaderConfig.from_env({"WARCORE_STRICT_PLUGINS": "1"})
    assert config.strict
    with pytest.raises(PluginLoadError, match=r"'wctest_broken'.*boom at import"):
        fresh_manager(config=config)


@pytest.mark.clean_install  # strict mode stops at the installed broken plugin first
def test_strict_mode_from_the_cli_fails_loudly(fake: FakeDists) -> None:
    fake.add("wctest_broken", RAISES_ON_IMPORT)
    result = _warcore("plugins", env=fake.env(WARCORE_STRICT_PLUGINS="1"))
    assert result.returncode == 1
    assert "'wctest_broken'" in result.stderr and "boom at import" in result.stderr


def test_misspelled_hook_fails_that_plugin_naming_plugin_and_hook(fake: FakeDists) -> None:
    fake.add(
        "wctest_typo",
        """
        import warcore
        from warcore import SharedReadBoundary


        @warcore.hookimpl
        def warcore_shared_read_boundry(backend, forward_mode, context):
            return SharedReadBoundary.PRE_REPLAY


        @warcore.hookimpl
        def warcore_is_war_publish_phase(algorithm, forward_mode):
            return True
        """,
    )
    pm = fresh_manager()
    typo = plugin_info(pm, "wctest_typo")
    assert typo.status == "failed"
    assert "'wctest_typo'" in (typo.error or "") and "'warcore_shared_read_boundry'" in (
        typo.error or ""
    )
    # Its correctly spelled hook was not left behind either: only the core answers for eagle.
    assert not pm.has_plugin("wctest_typo")
    assert resolve_war_publish_phase("eagle", ForwardMode.DECODE, pm=pm).source == "plugin:warcore"


def test_duplicate_entry_point_name_loads_neither(fake: FakeDists) -> None:
    """Neither twin is imported: sorted order (here ``a`` first) must not pick the winner, or a
    distribution named to sort first could displace a genuine plugin."""
    marker = fake.root / "imported.txt"
    for side in ("a", "b"):
        fake.add(
            "wctest_twin", marks(marker), dist=f"warcore-fake-{side}", module=f"_wcfake_twin_{side}"
        )
    pm = fresh_manager()
    twins = [i for i in pm.plugin_infos if i.name == "wctest_twin"]
    assert [t.status for t in twins] == ["failed", "failed"]
    for twin in twins:
        assert "'warcore-fake-a'" in (twin.error or "")
        assert "'warcore-fake-b'" in (twin.error or "")
        assert "WARCORE_PLUGINS=DISTRIBUTION:ENTRY_POINT" in (twin.error or "")
    assert not marker.exists()
    chosen = fresh_manager(
        config=LoaderConfig.from_env({"WARCORE_PLUGINS": "warcore-fake-b:wctest_twin"})
    )
    assert [(i.distribution, i.status) for i in chosen.plugin_infos if i.name == "wctest_twin"] == [
        ("warcore-fake-a", "disabled"),
        ("warcore-fake-b", "active"),
    ]


# -- re-entrant use of the process-wide manager at import -------------------------------------


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
    assert plugin_info(pm, "wctest_spawns").status == "active"


# -- resolution: failures and conflicts ----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("raise ValueError('cannot decide')", "ValueError: cannot decide"),
        ("return 'PRE_REPLAY'", "returned 'PRE_REPLAY' (str)"),
    ],
)
def test_failing_or_mistyped_hookimpl_counts_as_unknown(
    fake: FakeDists, body: str, error: str
) -> None:
    fake.add("wctest_good", DECLARES.format(boundary="PRE_REPLAY"))
    fake.add(
        "wctest_bad",
        f"""
        import warcore


        @warcore.hookimpl
        def warcore_shared_read_boundary(backend, forward_mode, context):
            {body}


        @warcore.hookimpl
        def warcore_is_war_publish_phase(algorithm, forward_mode):
            {body}
        """,
    )
    pm = fresh_manager()
    resolved = resolve_shared_read_boundary("torch_native", ForwardMode.EXTEND, pm=pm)
    assert resolved.boundary is SharedReadBoundary.UNKNOWN
    assert resolved.source == "default:failed:wctest_bad"
    assert [(f.plugin, f.hook) for f in resolved.failures] == [
        ("wctest_bad", "warcore_shared_read_boundary")
    ]
    assert error in resolved.failures[0].error
    # Even the contract default gives way: a failing plugin might have meant anything.
    decode = resolve_shared_read_boundary("torch_native", ForwardMode.DECODE, pm=pm)
    assert (decode.boundary, decode.source) == (
        SharedReadBoundary.UNKNOWN,
        "default:failed:wctest_bad",
    )
    phase = resolve_war_publish_phase("none", ForwardMode.DECODE, pm=pm)
    assert (phase.publishes, phase.source) == (False, "default:failed:wctest_bad")


def test_disagreeing_plugins_take_the_latest_and_check_names_both(fake: FakeDists) -> None:
    fake.add("wctest_early", DECLARES.format(boundary="PRE_REPLAY"))
    fake.add("wctest_late", DECLARES.format(boundary="POST_REPLAY"))
    pm = fresh_manager()
    resolved = resolve_shared_read_boundary("torch_native", ForwardMode.EXTEND, pm=pm)
    assert resolved.boundary is SharedReadBoundary.POST_REPLAY
    assert resolved.source == "default:conflict" and resolved.conflict
    assert sorted(resolved.answers) == [
        ("wctest_early", SharedReadBoundary.PRE_REPLAY),
        ("wctest_late", SharedReadBoundary.POST_REPLAY),
    ]
    result = _warcore("check", env=fake.env())
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "conflict" in line]
    assert len(lines) == 1, result.stdout  # one line, not one per algorithm
    assert "wctest_early=PRE_REPLAY" in lines[0] and "wctest_late=POST_REPLAY" in lines[0]
    assert "'torch_native'" in lines[0] and "EXTEND" in lines[0]


def test_agreeing_plugins_are_no_conflict(fake: FakeDists) -> None:
    fake.add("wctest_one", DECLARES.format(boundary="PRE_REPLAY"))
    fake.add("wctest_two", DECLARES.format(boundary="PRE_REPLAY"))
    resolved = resolve_shared_read_boundary("torch_native", ForwardMode.EXTEND, pm=fresh_manager())
    assert (resolved.boundary, resolved.source) == (
        SharedReadBoundary.PRE_REPLAY,
        "plugin:wctest_one+wctest_two",
    )


@pytest.mark.plugins()
def test_check_reports_failed_plugins_and_unknown_allowlist_names(fake: FakeDists) -> None:
    fake.add("wctest_broken", RAISES_ON_IMPORT)
    result = _warcore("check", env=fake.env(WARCORE_PLUGINS="wctest_broken,trtllm_mha,nosuch"))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any("'wctest_broken'" in line and "boom at import" in line for line in lines), lines
    assert any("WARCORE_PLUGINS" in line and "'nosuch'" in line for line in lines), lines
    assert "ok" not in lines


def test_duplicate_backend_names_are_an_error_naming_both(fake: FakeDists) -> None:
    offers_twin = """
        import warcore


        def _make(**kwargs):
            raise AssertionError("never built")


        @warcore.hookimpl
        def warcore_attention_backends():
            return [warcore.BackendSpec("wctest_twin", _make, "{who}")]
        """
    fake.add("wctest_first", offers_twin.format(who="wctest_first"), dist="warcore-fake-first")
    fake.add("wctest_second", offers_twin.format(who="wctest_second"), dist="warcore-fake-second")
    registry = get_registry(fresh_manager())
    assert "wctest_twin" not in registry.backends and "torch_native" in registry.backends
    with pytest.raises(DuplicateNameError) as info:
        registry.backend("wctest_twin")
    assert "wctest_first (warcore-fake-first)" in str(info.value)
    assert "wctest_second (warcore-fake-second)" in str(info.value)
    result = _warcore("check", env=fake.env())
    assert result.returncode == 1
    assert "'wctest_twin'" in result.stdout and "wctest_first (warcore-fake-first)" in result.stdout
    assert "wctest_second (warcore-fake-second)" in result.stdout


@pytest.mark.plugins()
def test_failing_spec_hook_is_a_registry_problem(fake: FakeDists) -> None:
    fake.add(
        "wctest_offers_junk",
        """
        import warcore


        @warcore.hookimpl
        def warcore_speculative_algorithms():
            return ["dflash"]
        """,
    )
    registry = get_registry(fresh_manager())
    assert any(
        "'wctest_offers_junk'" in p and "warcore_speculative_algorithms" in p
        for p in registry.problems
    )
    assert "dflash" in registry.algorithms  # the real plugin's offer is unaffected


# -- a failing hook is logged once ------------------------------------------------------------

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


@pytest.mark.plugin_agnostic
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


# -- a quiet check ----------------------------------------------------------------------------


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


# -- the decision cache follows the plugin set ---------------------------------------------


@pytest.mark.plugins()
def test_decision_cache_is_invalidated_on_register_and_unregister(fake: FakeDists) -> None:
    fake.add("wctest_snapshot", DECLARES.format(boundary="PRE_REPLAY"))
    pm = WarcorePluginManager(LoaderConfig())
    real = [ep for ep in md.entry_points(group="warcore") if ep.name in REAL_PLUGINS]
    pm.load_entry_points(real)
    cache = get_decision_cache(pm)
    key = (
        RunnerKind.PREFILL,
        "torch_native",
        ForwardMode.EXTEND,
        BoundaryContext("none"),
        Execution.GRAPH_PLANTED,
    )
    assert cache[key].record_point is RecordPoint.NONE
    pm.load_entry_points(md.entry_points(group="warcore").select(name="wctest_snapshot"))
    assert cache[key].record_point is RecordPoint.PRE_REPLAY
    assert cache[key].source == "plugin:wctest_snapshot"
    pm.unregister(name="wctest_snapshot")
    assert cache[key].record_point is RecordPoint.NONE
