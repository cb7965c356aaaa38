"""Plugin loading and resolution through real entry-point metadata.

Each fake plugin is a real distribution as far as ``importlib.metadata`` can tell: a module plus
a ``<name>-<version>.dist-info/`` folder with ``METADATA`` and ``entry_points.txt``, in a folder
put on ``sys.path`` (in process) or ``PYTHONPATH`` (``warcore`` run as a subprocess). Nothing
here calls ``register`` to install a plugin; the installed real plugins load alongside.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import subprocess
import sys

import pytest
from _support import fresh_manager
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
    PluginInfo,
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


def _info(pm: WarcorePluginManager, name: str) -> PluginInfo:
    matches = [i for i in pm.plugin_infos if i.name == name]
    assert len(matches) == 1, pm.plugin_infos
    return matches[0]


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
    broken = _info(pm, "wctest_broken")
    assert broken.status == "failed"
    assert broken.distribution == "warcore-fake-broken" and broken.version == "0.3"
    assert broken.error == "RuntimeError: boom at import"
    assert _info(pm, "wctest_good").status == "active"  # sorted after it: loading went on
    assert _info(pm, "wctest_good").version == "1.0"
    for name in REAL_PLUGINS:
        assert _info(pm, name).status == "active"
    warnings = [r.getMessage() for r in caplog.records if "'wctest_broken'" in r.getMessage()]
    assert len(warnings) == 1 and "boom at import" in warnings[0]
    resolved = resolve_shared_read_boundary("torch_native", ForwardMode.EXTEND, pm=pm)
    assert (resolved.boundary, resolved.source) == (
        SharedReadBoundary.PRE_REPLAY,
        "plugin:wctest_good",
    )


def test_strict_mode_raises_naming_the_plugin(fake: FakeDists) -> None:
    fake.add("wctest_broken", RAISES_ON_IMPORT)
    config = LoaderConfig.from_env({"WARCORE_STRICT_PLUGINS": "1"})
    assert config.strict
    with pytest.raises(PluginLoadError, match=r"'wctest_broken'.*boom at import"):
        fresh_manager(config=config)


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
    typo = _info(pm, "wctest_typo")
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


# -- environment controls ------------------------------------------------------------------


@pytest.mark.plugins()
def test_empty_allowlist_loads_none(fake: FakeDists, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = fake.root / "imported.txt"
    fake.add("wctest_spy", f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("WARCORE_PLUGINS", "")
    pm = get_plugin_manager()  # the process-wide manager, built from the environment
    active = {i.name for i in pm.plugin_infos if i.status == "active"}
    assert active == {"warcore"}  # the core's own built-ins only
    for name in REAL_PLUGINS | {"wctest_spy"}:
        assert _info(pm, name).status == "disabled"
        assert "WARCORE_PLUGINS" in (_info(pm, name).error or "")
    assert not marker.exists()
    assert "trtllm_mha" not in get_registry(pm).backends


@pytest.mark.plugins()
def test_allowlist_matches_entry_point_or_distribution_names(fake: FakeDists) -> None:
    fake.add("wctest_good", DECLARES.format(boundary="PRE_REPLAY"), dist="warcore-fake-good")
    pm = fresh_manager(
        config=LoaderConfig.from_env({"WARCORE_PLUGINS": "warcore_fake_good, dflash, nosuch"})
    )
    assert _info(pm, "wctest_good").status == "active"  # by distribution name, normalised
    assert _info(pm, "dflash").status == "active"  # by entry-point name
    assert _info(pm, "trtllm_mha").status == "disabled"
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
        info = _info(pm, "wctest_blocked")
        assert info.status == "disabled" and "WARCORE_DISABLE_PLUGINS" in (info.error or "")
        assert _info(pm, "deepseek_v4").status == "disabled"
        assert _info(pm, "trtllm_mha").status == "active"
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
    assert _info(pm, "wctest_good").status == "active"  # plugins still load; nothing publishes
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
