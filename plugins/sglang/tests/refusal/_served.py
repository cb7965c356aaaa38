"""sglang 0.5.20's real ``Engine`` on this CPU, run once for the refusal tests (the fixtures
are in ``conftest.py``): :func:`warcore_sglang.serving.run_engine` (a child process, every wait
bounded, every process it started stopped by its pid), with ``WARCORE_SGLANG=1`` and a trace."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warcore_sglang.audit import trace
from warcore_sglang.serving import harness as serving

REFUSED = "0.5.20"
"""The sglang release these tests install (``plugins/sglang/sglang-0.5.20-pins.txt``)."""
AUDITED = "0.5.21, 0.5.22, 0.5.23"
"""The audited releases, as the refusal names them."""
TIMEOUT = float(os.environ.get("WARCORE_SGLANG_SERVER_TIMEOUT", "420"))
"""Seconds the engine may take, start-up to shutdown."""
WAVES = serving.two_waves(3, 6)
ENV = {
    "WARCORE_SGLANG": "1",
    "WARCORE_PLUGINS": "",
    "WARCORE_FORCE_COARSE": "",
    # 0.5.20's prefill read-done is off unless asked for (EnvBool(False)): asked for
    "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1",
}


@dataclass
class Served:
    """What the engine did: the tokens it returned, the trace's records, its log."""

    tokens: dict[str, list[int]]
    records: list[dict[str, Any]]
    log: str

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def log_text(self) -> str:
        return Path(self.log).read_text(errors="replace")


def serve(root: Path) -> Served:
    model = serving.write_tiny_model(root / "model")
    trace_path = root / "trace.jsonl"
    env = {**serving.cpu_env(), **ENV, trace.ENV_TRACE: str(trace_path)}
    # torch_native: 0.5.20 runs an out-of-tree backend's prefill through triton (its
    # support_triton checks the backend's name only), which a CPU has no stand-in for
    args = serving.cpu_engine_args(model, attention_backend="torch_native")
    result = serving.run_engine(args, WAVES, env=env, timeout=TIMEOUT, workdir=root, name="engine")
    return Served(result["tokens"], trace.read_trace(trace_path), result["log"])
