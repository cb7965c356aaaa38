"""Real sglang 0.5.23 servers for the tests of this folder (``nox -s sglang_server``); the
fixtures are in ``conftest.py``.

Each configuration below is one real server start: sglang's ``Engine`` in a child process
(:func:`warcore_sglang.serving.run_engine`), or ``python -m warcore_sglang.serving.launch_server``
over
HTTP on 127.0.0.1 with a free port; every wait is bounded and every process is stopped by its
pid, also when a test fails. The configurations start in the background as the session begins,
two at a time, and each is shared by every test that asserts on it: a test asks for its
configuration's :class:`Run` (tokens, trace records, log).

Installed as distributions in the session's venv (entry points, not ``register()`` calls):
warcore, warcore-sglang, ``dists/sglang_fork_attn`` (an out-of-tree sglang backend) and
``dists/warcore_sglang_test_plugins`` (third-party warcore plugins); each server picks its
warcore plugins with ``WARCORE_PLUGINS``.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from warcore_sglang.audit import sanitize, trace
from warcore_sglang.serving import harness as serving

REQUIRED = ("sglang_fork_attn", "warcore_sglang_test_plugins", "xgrammar", "psutil")
missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
if missing:  # a broken environment must fail, never skip: nox -s sglang_server installs these
    raise pytest.UsageError(
        f"the real-server tests need {', '.join(missing)} installed: run them with "
        "nox -s sglang_server"
    )

PARALLEL = int(os.environ.get("WARCORE_SGLANG_SERVER_PARALLEL", "2"))
"""Server configurations started at once (2 cores: two overlap their imports)."""
TIMEOUT = float(os.environ.get("WARCORE_SGLANG_SERVER_TIMEOUT", "420"))
"""Seconds one server configuration may take, start-up to shutdown."""

WAVES = serving.two_waves(6, 12)
TAGGED = serving.tagged(WAVES, sanitize.TAG)
COMMON = {"SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1"}
"""sglang's prefill read-done fast path is opt-in; on, so that a backend declaring prefill
``PRE_REPLAY`` publishes early under sglang alone."""


@dataclass(frozen=True)
class Config:
    name: str
    backend: str
    env: dict[str, str]
    http: bool = False
    sanitize: bool = False
    """Run the waves plain, then again tagged (the sanitizer poisons the tagged batches)."""
    tp: int = 1
    """Tensor-parallel ranks: one scheduler process each (CPU: one core each, bound)."""
    refused: bool = False
    """Its start-up must fail (``serving.run_refused_engine``): no waves are served."""


RANK_TIMEOUT = "WARCORE_SGLANG_CHECK_RANKS_TIMEOUT"
RANK_TIMEOUT_S = 20.0
ACTIVE = {"WARCORE_SGLANG": "1"}
CHECK = {**ACTIVE, "WARCORE_SGLANG_CHECK_RANKS": "1"}


CONFIGS = {
    c.name: c
    for c in (
        # warcore active through its launcher, over HTTP; the only plugin allowed declares
        # torch_native's prefill earlier than sglang does (nobody outvotes it), so sglang's own
        # declaration is what stands, and the sanitizer audits it
        Config(
            "warcore_http",
            "torch_native",
            {"WARCORE_PLUGINS": "early_native"},
            http=True,
            sanitize=True,
        ),
        # warcore installed (every distribution above) but not activated: sglang alone
        Config("fork_alone", "fork_native", {}, sanitize=True),
        Config(
            "fork_late",
            "fork_native",
            {"WARCORE_SGLANG": "1", "WARCORE_PLUGINS": "sglang,fork_late"},
            sanitize=True,
        ),
        Config(
            "fork_raiser",
            "fork_native",
            {"WARCORE_SGLANG": "1", "WARCORE_PLUGINS": "sglang,fork_raiser"},
        ),
        Config(
            "force_coarse",
            "fork_native",
            {"WARCORE_SGLANG": "1", "WARCORE_PLUGINS": "sglang", "WARCORE_FORCE_COARSE": "1"},
        ),
        # two tensor-parallel ranks (issue 28): sglang alone; warcore with the rank check, over
        # the Engine API and over HTTP; refused for a rank-dependent plugin, for one raising on
        # one rank, for a rank that dies and for one that hangs before the check; served
        # coarse where they differ under warn; a real per-rank divergence, unchecked, for the
        # trace comparison
        Config("tp2_alone", "fork_native", {}, tp=2),
        Config("tp2_engine", "fork_native", {**CHECK, "WARCORE_PLUGINS": "sglang"}, tp=2),
        Config("tp2_http", "fork_native", {**CHECK, "WARCORE_PLUGINS": "sglang"}, http=True, tp=2),
        Config(  # both on rank 1: one answers differently (prefill), one fails (decode)
            "tp2_by_rank",
            "fork_native",
            {**CHECK, "WARCORE_PLUGINS": "sglang,by_rank,rank_raiser"},
            tp=2,
            refused=True,
        ),
        Config(
            "tp2_dying",
            "fork_native",
            {**CHECK, "WARCORE_PLUGINS": "sglang,rank_one", "WCTEST_RANK_ONE": "exit"},
            tp=2,
            refused=True,
        ),
        Config(
            "tp2_stalled",
            "fork_native",
            {**CHECK, "WARCORE_PLUGINS": "sglang,rank_one", "WCTEST_RANK_ONE": "hang"}
            | {RANK_TIMEOUT: str(RANK_TIMEOUT_S)},
            tp=2,
            refused=True,
        ),
        Config(
            "tp2_warn",
            "fork_native",
            {**ACTIVE, "WARCORE_SGLANG_CHECK_RANKS": "warn", "WARCORE_PLUGINS": "sglang,by_rank"},
            tp=2,
        ),
        Config(
            "tp2_divergent", "fork_native", {**ACTIVE, "WARCORE_PLUGINS": "sglang,by_rank"}, tp=2
        ),
    )
}


@dataclass
class Run:
    """What one real server did."""

    config: Config
    tokens: dict[str, list[int]]
    records: list[dict[str, Any]]
    log: str
    trace_path: Path
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def barriers(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.kind("barrier") if all(r.get(k) == v for k, v in match.items())]

    def prefills(self) -> list[dict[str, Any]]:
        """The ``EXTEND`` barriers of the workload's batches (the HTTP server's own warm-up and
        health-check requests left out)."""
        ours = {r.rid for wave in (*WAVES, *TAGGED) for r in wave}
        return [b for b in self.barriers(mode="EXTEND") if set(b.get("rids", [])) & ours]

    def scheduler(self) -> dict[str, Any]:
        """The process record of the (one) scheduler child."""
        found = self.schedulers()
        assert len(found) == 1, (found, self.log_tail())
        return found[0]

    def schedulers(self) -> list[dict[str, Any]]:
        """The process records of the scheduler children, by tensor-parallel rank."""
        found = [r for r in self.kind("process") if r["role"] == "scheduler"]
        return sorted(found, key=lambda r: r["rank"].get("tp") or 0)

    def plain(self) -> dict[str, list[int]]:
        return {k: v for k, v in self.tokens.items() if not k.startswith(sanitize.TAG)}

    def poisoned(self) -> dict[str, list[int]]:
        return {k: v for k, v in self.tokens.items() if k.startswith(sanitize.TAG)}

    def log_text(self) -> str:
        return Path(self.log).read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def _env(config: Config, trace_path: Path) -> dict[str, str]:
    env = {**serving.cpu_env(), **COMMON, **config.env, trace.ENV_TRACE: str(trace_path)}
    if config.sanitize:
        env[sanitize.ENV_SANITIZE] = "tagged"
    if config.tp > 1:  # sglang's CPU path binds each rank to cores: one core each here
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(r % 2) for r in range(config.tp))
    for var in ("WARCORE_SGLANG", "WARCORE_PLUGINS", "WARCORE_FORCE_COARSE"):
        env.setdefault(var, "")  # nothing leaks in from the environment the tests run in
    env.setdefault("WARCORE_SGLANG_CHECK_RANKS", "")
    return env


def _run(config: Config, model: Path, work: Path) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    trace_path = work / "trace.jsonl"
    trace_path.unlink(missing_ok=True)
    env = _env(config, trace_path)
    waves = [*WAVES, *TAGGED] if config.sanitize else WAVES
    start = time.monotonic()
    args = {"attention_backend": config.backend, "tp_size": config.tp}
    if config.refused:
        result = serving.run_refused_engine(
            serving.cpu_engine_args(model, **args),
            env=env,
            timeout=TIMEOUT,
            workdir=work,
            name=config.name,
        )
        records = trace.read_trace(trace_path) if trace_path.exists() else []
        elapsed = time.monotonic() - start
        return Run(config, {}, records, result["log"], trace_path, elapsed, result)
    if config.http:
        argv = serving.cpu_server_argv(model, **args)
        server = serving.HttpServer(argv, env=env, workdir=work, name=config.name)
        with server.start(timeout=TIMEOUT):
            tokens: dict[str, list[int]] = {}
            for wave in waves:
                tokens |= server.generate(wave)
            extra = {"startup_s": server.startup_s, "pids": server.pids}
        log = str(server.log)
    else:
        result = serving.run_engine(
            serving.cpu_engine_args(model, **args),
            waves,
            env=env,
            timeout=TIMEOUT,
            workdir=work,
            name=config.name,
        )
        tokens, log, extra = result["tokens"], result["log"], result
    return Run(
        config,
        tokens,
        trace.read_trace(trace_path),
        log,
        trace_path,
        time.monotonic() - start,
        extra,
    )


ONLY = [n for n in os.environ.get("WARCORE_SGLANG_SERVERS", "").split(",") if n.strip()]
"""``WARCORE_SGLANG_SERVERS=a,b``: start only these configurations (while working on their
tests); the tests of the others skip. Unset: all of them."""


class Servers:
    """The configurations, started in the background, each awaited by the tests using it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = serving.write_tiny_model(root / "model")
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=PARALLEL)
        unknown = [n for n in ONLY if n not in CONFIGS]
        if unknown:
            raise pytest.UsageError(f"WARCORE_SGLANG_SERVERS names no configuration {unknown}")
        self.futures = {
            name: self.pool.submit(_run, config, self.model, root / name)
            for name, config in CONFIGS.items()
            if not ONLY or name in ONLY
        }

    def __getitem__(self, name: str) -> Run:
        if name not in self.futures:
            pytest.skip(f"{name} not started (WARCORE_SGLANG_SERVERS={','.join(ONLY)})")
        return self.futures[name].result(timeout=TIMEOUT * len(CONFIGS))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
