"""warcore-sglang's warcore plugin on its own: the registry table against sglang's factories,
custom algorithms registered through sglang's ``spec_registry``, the launcher and the
benchmark command."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import warcore_sglang.declarations.plugin
from _release import RELEASE
from warcore_sglang.declarations.names import LEAVES, SRT, WRAPPERS

import warcore
from warcore import BoundaryContext, ForwardMode, StepFacts
from warcore.core import WarcorePluginManager, get_registry


def _sources(fn: Any, depth: int = 0) -> Iterator[str]:
    """The source of a registry factory and of the ``create_*`` builders it calls."""
    source = textwrap.dedent(inspect.getsource(fn))
    yield source
    if depth >= 2:
        return
    for node in ast.walk(ast.parse(source)):
        found: list[Any] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name.startswith("create_"):
                    try:
                        found.append(getattr(importlib.import_module(node.module), alias.name))
                    except Exception:  # another platform's module (torch_npu, ...)
                        continue
        elif isinstance(node, ast.Name) and node.id.startswith("create_"):
            found.append(fn.__globals__.get(node.id))
        for builder in found:
            if inspect.isfunction(builder) and builder is not fn:
                yield from _sources(builder, depth + 1)


def test_every_registry_name_has_its_class_and_its_factory_builds_it() -> None:
    """The table says which class each registry name builds on CUDA: each factory (or a
    builder it calls) names that class, and the table covers sglang's whole registry."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    assert set(ATTENTION_BACKENDS) == set(RELEASE.registry), "sglang's registry changed"
    for name, ref in RELEASE.registry.items():
        cls_name = ref.partition(":")[2]
        assert any(cls_name in s for s in _sources(ATTENTION_BACKENDS[name])), (name, cls_name)


def test_wrapper_and_leaf_classes_exist_and_wrappers_declare() -> None:
    for name, shape in WRAPPERS.items():
        module, _, cls_name = shape.cls.partition(":")
        klass = getattr(importlib.import_module(SRT + module), cls_name)
        assert "shared_read_ends" in vars(klass), name
    for name, ref in LEAVES.items():
        module, _, cls_name = ref.partition(":")
        if name in RELEASE.leaves_missing:
            assert importlib.util.find_spec(SRT + module) is None, name  # gone, as said
            continue
        assert getattr(importlib.import_module(SRT + module), cls_name), name


@pytest.fixture
def custom_algorithm() -> Iterator[str]:
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class MyEagleWorker(EAGLEWorkerV2):  # a plugin's worker: the draft-extend reads last
        pass

    SpeculativeAlgorithm.register("WARCORE_TEST", supports_overlap=True)(
        lambda server_args: MyEagleWorker
    )
    try:
        yield "sglang_warcore_test"
    finally:
        del spec_registry._REGISTRY["WARCORE_TEST"]


def test_custom_algorithms_from_spec_registry(custom_algorithm: str) -> None:
    pm = WarcorePluginManager()
    pm.register(warcore_sglang.declarations.plugin, name="sglang")
    spec = get_registry(pm).algorithm(custom_algorithm)
    assert spec.engine == "sglang"
    # CustomSpecAlgo.supports_prefill_shared_read_done() is False: its prefill never publishes.
    gate = warcore.resolve_war_publish_phase(custom_algorithm, ForwardMode.EXTEND, pm=pm)
    assert (gate.publishes, gate.source) == (False, "plugin:sglang")
    owner = warcore.resolve_step_event_owner(custom_algorithm, StepFacts(), pm=pm)
    assert (owner.owner, owner.source) == ("draft", "plugin:sglang")  # its worker's property
    ctx = BoundaryContext(custom_algorithm)
    res = warcore.resolve_shared_read_boundary("sglang_dsv4", ForwardMode.TARGET_VERIFY, ctx, pm=pm)
    assert res.boundary.name == "POST_REPLAY"  # dsv4 under a non-DSPARK algorithm


def test_the_reference_engines_names_are_left_alone() -> None:
    pm = WarcorePluginManager()
    pm.register(warcore_sglang.declarations.plugin, name="sglang")
    for backend in ("torch_native", "trtllm_mha", "deepseek_v4"):
        for mode in ForwardMode:
            impls = pm.hook.warcore_shared_read_boundary.get_hookimpls()
            plugin = next(i for i in impls if i.plugin_name == "sglang")
            assert (
                plugin.function(backend=backend, forward_mode=mode, context=BoundaryContext())
                is None
            )
    plugin = warcore_sglang.declarations.plugin
    assert plugin.warcore_is_war_publish_phase("eagle", ForwardMode.EXTEND) is None
    assert plugin.warcore_step_event_owner("dflash", StepFacts()) is None
    registry = get_registry(pm)
    assert all(
        n.startswith("sglang_") for n, o in registry.backends.items() if o.plugin == "sglang"
    )
    with pytest.raises(RuntimeError, match="sglang's ModelRunner builds it"):
        registry.backend("sglang_dsv4").factory()


def test_importing_the_plugin_imports_no_sglang() -> None:
    code = (
        "import sys, warcore_sglang, warcore_sglang.declarations.plugin, "
        "warcore_sglang.activation; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.any_release  # the command's own working, on whichever release
def test_the_launcher_runs_sglangs_launch_server_with_the_variable_set() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warcore_sglang.serving.launch_server", "--help"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--model-path" in done.stdout


@pytest.mark.any_release  # the command's own working, on whichever release
def test_the_benchmark_reports_both_and_their_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "warcore_sglang.serving.bench",
            "--calls",
            "2000",
            "--repeat",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.read_text())
    assert len(result["cases"]) == 4
    for case in result["cases"]:
        assert case["sglang_ns"] > 0 and case["warcore_ns"] > 0
        assert case["ratio"] == pytest.approx(case["warcore_ns"] / case["sglang_ns"], rel=0.01)
        assert case["sglang_answer"] == case["warcore_answer"], case  # same decision
        assert case["warcore_over_floor"] == pytest.approx(
            case["warcore_ns"] / case["floor_ns"], rel=0.01
        )
    assert result["within_goal"] is (result["max_over_floor"] <= 1.25)
    assert "warcore / floor (an empty Python method): max" in done.stdout
