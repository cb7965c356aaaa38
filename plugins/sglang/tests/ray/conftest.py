"""warcore-sglang in sglang's ``RayEngine`` on a local Ray cluster (``nox -s sglang_ray``; the
other sglang sessions, without Ray, leave this folder out).

One cluster of two nodes for the session, and six drivers on it, one after the other (two
cores: one engine at a time): sglang alone at tp 2, and with ``WARCORE_SGLANG=1`` at tp 1, tp 2
on one node, tp 2 across the two nodes, and tp 1 where warcore-sglang cannot be imported in the
actor (whose scheduler is then sglang's alone: the tokens of tp 1 without warcore), and sglang
alone at tp 2 where the first forward's C++ build fails (the actors' event loops die). They run
once, before the first test that asks for them; every test asserts on their logs, traces and
tokens. The cluster is stopped by pid at the end.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without Ray and sglang
else:
    from _rays import (
        Run,
        Runs,
        broken_warcore_sglang,
        engine_args,
        run,
        start_cluster,
        stop_cluster,
    )
    from warcore_sglang.serving import harness

    def _all(root: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        """Each run: (engine arguments, what else its driver gets)."""
        model = harness.write_tiny_model(root / "model")
        on = {"env": {"WARCORE_SGLANG": "1"}}
        broken = f"{broken_warcore_sglang(root)}:{harness.BOOT}"
        return {
            "alone": (engine_args(model, tp_size=2), {}),
            "tp1": (engine_args(model), on),
            "tp2": (engine_args(model, tp_size=2), on),
            "nodes": (engine_args(model, tp_size=2, nnodes=2), on),
            "broken": (
                engine_args(model),
                {**on, "runtime_env": {"env_vars": {"PYTHONPATH": broken}}},
            ),
            # tp 2's first forward builds C++ (torch.compile): no compiler, the actor's event
            # loop dies there; sglang alone
            "dies": (
                engine_args(model, tp_size=2),
                {"runtime_env": _no_compiler(root), "fails": True},
            ),
        }

    def _no_compiler(root: Path) -> dict[str, object]:
        cache = root / "inductor"  # an empty cache: the build is not skipped
        return {"env_vars": {"CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(cache)}}

    @pytest.fixture(scope="session")
    def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
        root = tmp_path_factory.mktemp("ray")
        cluster = start_cluster()
        try:
            done: dict[str, Run | Exception] = {}
            for name, (engine, extra) in _all(root).items():
                try:
                    done[name] = run(cluster, root, name, engine, **extra)
                except Exception as exc:  # that run's tests fail with it; the others go on
                    done[name] = exc
            yield Runs(done, cluster.raylets())
        finally:
            stop_cluster(cluster)
