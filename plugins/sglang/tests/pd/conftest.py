"""Real sglang 0.5.23 prefill/decode disaggregation on this CPU (``nox -s sglang_pd``): the runs
the tests of this folder assert on, each started once, in the background as the session begins
(two at a time), every process stopped by its pid.

* ``plain``: one ordinary server, sglang alone: the reference tokens.
* ``warcore``: a prefill and a decode server with warcore active (the trace, the sanitizer on
  tagged requests, the rank check) and ``sglang-router`` in front; the workload plain, then
  tagged. The decode side's KV pool is small (``--max-total-tokens``), so that new requests
  are given the slots of requests that just finished (what the transfer order is about).
* ``mixed``: a prefill server with warcore and a decode server without it, a router in front,
  one request.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from warcore_sglang.audit import sanitize, trace
from warcore_sglang.serving import harness, pd

REQUIRED = ("sglang_router", "mooncake", "prometheus_client", "psutil")
missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
if missing:  # a broken environment must fail, never skip
    raise pytest.UsageError(
        f"the PD tests need {', '.join(missing)} installed: run them with nox -s sglang_pd"
    )

TIMEOUT = float(os.environ.get("WARCORE_SGLANG_SERVER_TIMEOUT", "420"))
WAVES = harness.two_waves(6, 12)
TAGGED = harness.tagged(WAVES, sanitize.TAG)
CONCURRENCY = 6
"""Requests in flight at once: requests finish while others arrive."""
DECODE_ARGS = {"max_total_tokens": 160, "num_reserved_decode_tokens": 12}
"""The decode side's KV pool (tokens) and what its admission reserves per request for decoding
(sglang's default, 512, exceeds such a pool: nothing is ever admitted): six requests of up to
52 tokens do not fit at once, so new requests wait for the slots of finished ones."""
WARCORE = {
    "WARCORE_SGLANG": "1",
    "WARCORE_PLUGINS": "sglang",
    "WARCORE_SGLANG_CHECK_RANKS": "1",
    "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1",
}
ALONE = {"WARCORE_SGLANG": "", "WARCORE_PLUGINS": "", "WARCORE_SGLANG_CHECK_RANKS": ""}


@dataclass
class Run:
    """What one configuration did: tokens by rid, each side's trace and log."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""
    """The mixed pair: what the client got instead of tokens."""
    request_s: float = 0.0

    def plain(self) -> dict[str, list[int]]:
        return {k: v for k, v in self.tokens.items() if not k.startswith(sanitize.TAG)}

    def poisoned(self) -> dict[str, list[int]]:
        return {k: v for k, v in self.tokens.items() if k.startswith(sanitize.TAG)}

    def kind(self, side: str, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records[side] if r.get("kind") == kind]


def _env(side_trace: Path, extra: dict[str, str], sanitizer: bool) -> dict[str, str]:
    env = {**pd.pd_env(), **extra, trace.ENV_TRACE: str(side_trace)}
    env[sanitize.ENV_SANITIZE] = "tagged" if sanitizer else ""
    return env


def _read(pair: pd.Pair, work: Path, run: Run) -> Run:
    for side in ("prefill", "decode"):
        path = work / f"{side}.jsonl"
        run.records[side] = trace.read_trace(path) if path.exists() else []
        run.logs[side] = (work / f"{side}.log").read_text(errors="replace")
    run.logs["router"] = pair.router.log.read_text(errors="replace")
    return run


def run_plain(model: Path, work: Path) -> Run:
    start = time.monotonic()
    env = {**harness.cpu_env(), **ALONE}
    argv = harness.cpu_server_argv(model)
    server = harness.HttpServer(argv, module=pd.LAUNCHER, env=env, workdir=work, name="plain")
    with server.start(timeout=TIMEOUT):
        tokens: dict[str, list[int]] = {}
        for wave in WAVES:
            tokens |= pd.generate_each(server.url, wave, CONCURRENCY)
    return Run(tokens=tokens, seconds=time.monotonic() - start)


def run_warcore(model: Path, work: Path) -> Run:
    start = time.monotonic()
    envs = {s: _env(work / f"{s}.jsonl", WARCORE, True) for s in ("prefill", "decode")}
    run = Run()
    with pd.started(
        model,
        work,
        prefill_env=envs["prefill"],
        decode_env=envs["decode"],
        decode_args=DECODE_ARGS,
        timeout=TIMEOUT,
    ) as pair:
        for wave in [*WAVES, *TAGGED]:
            run.tokens |= pd.generate_each(pair.url, wave, CONCURRENCY)
    run.seconds = time.monotonic() - start
    return _read(pair, work, run)


def run_mixed(model: Path, work: Path) -> Run:
    start = time.monotonic()
    prefill_env = _env(work / "prefill.jsonl", WARCORE, False)
    decode_env = _env(work / "decode.jsonl", ALONE, False)
    run = Run()
    with pd.started(
        model, work, prefill_env=prefill_env, decode_env=decode_env, timeout=TIMEOUT
    ) as pair:
        asked = time.monotonic()
        try:
            run.tokens = pd.generate_each(pair.url, WAVES[0][:1], timeout=60.0)
        except urllib.error.HTTPError as exc:
            run.error = f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"
        except OSError as exc:
            run.error = f"{type(exc).__name__}: {exc}"
        run.request_s = time.monotonic() - asked
        time.sleep(1.0)  # the servers' own lines about it reach their logs
    run.seconds = time.monotonic() - start
    return _read(pair, work, run)


class Runs:
    """The configurations, started in the background as the session begins."""

    def __init__(self, root: Path) -> None:
        self.model = harness.write_tiny_model(root / "model")
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.futures = {
            name: self.pool.submit(fn, self.model, root / name)
            for name, fn in (("warcore", run_warcore), ("plain", run_plain), ("mixed", run_mixed))
        }

    def __getitem__(self, name: str) -> Run:
        return self.futures[name].result(timeout=TIMEOUT * 3)

    def __enter__(self) -> Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    with Runs(tmp_path_factory.mktemp("pd")) as started:
        yield started
