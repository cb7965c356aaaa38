"""The installed sglang release's real ``Engine`` on this CPU, twice: with warcore active and
with sglang alone (:func:`warcore_sglang.serving.harness.run_engine`: a child process, every
wait bounded, every process it started stopped by its pid), the same requests, a trace."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warcore_sglang.audit import trace
from warcore_sglang.serving import harness as serving

TIMEOUT = float(os.environ.get("WARCORE_SGLANG_SERVER_TIMEOUT", "420"))
"""Seconds one engine may take, start-up to shutdown."""
WAVES = serving.two_waves(3, 6)


@dataclass
class Served:
    tokens: dict[str, list[int]]
    records: list[dict[str, Any]]
    log: str

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]


@dataclass
class Engines:
    warcore: Served
    alone: Served


def _serve(root: Path, activate: bool) -> Served:
    model = serving.write_tiny_model(root / "model")
    trace_path = root / "trace.jsonl"
    env = {
        **serving.cpu_env(),
        "WARCORE_SGLANG": "1" if activate else "0",
        "WARCORE_PLUGINS": "sglang",  # sglang's own declarations, as warcore answers them
        trace.ENV_TRACE: str(trace_path),
    }
    # torch_native: every audited release's CPU path (0.5.21's triton check is by name)
    args = serving.cpu_engine_args(model, attention_backend="torch_native")
    name = "warcore" if activate else "alone"
    result = serving.run_engine(args, WAVES, env=env, timeout=TIMEOUT, workdir=root, name=name)
    return Served(result["tokens"], trace.read_trace(trace_path), result["log"])


def serve_both(root: Path) -> Engines:
    (root / "warcore").mkdir()
    (root / "alone").mkdir()
    return Engines(_serve(root / "warcore", True), _serve(root / "alone", False))
