"""Run sglang's prefill/decode disaggregation on a CPU, bounded: a prefill server, a decode server
(the Mooncake transfer engine over TCP on 127.0.0.1) and ``sglang-router --pd-disaggregation``
in front. Used by the PD tests (plugins/sglang/tests/pd) and ``bench_server --pd``;
docs/sglang-pd.md.

What PD needs on a CPU beyond :func:`warcore_sglang.serving.harness.cpu_env` (each named in
docs/sglang-pd.md with why): the transfer backend ``mooncake_tcp`` (mooncake with
``MC_FORCE_TCP=1``), ``SGLANG_HOST_IP=127.0.0.1`` (the address the transfer engine and the
bootstrap server advertise), ``--disaggregation-decode-retraction-backup cpu_tensor`` on the
decode side (the default, ``host_pool``, registers host memory with CUDA), and the test
harness's stand-in ``WARCORE_SGLANG_PD_STANDIN=1`` (plugins/sglang/tests/_boot: the prefill
side's sender without host tensor indices).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import harness

__all__ = ["Pair", "PdError", "Router", "generate_each", "pd_env", "side_argv", "started"]

BACKEND = "mooncake_tcp"
LAUNCHER = "sglang.launch_server"
"""sglang's own launcher: each side's ``WARCORE_SGLANG`` decides (warcore's launcher would set
it, and the mixed pair needs a side without)."""


class PdError(RuntimeError):
    """A PD process failed or did not answer in time; the message names it and its log."""


def pd_env() -> dict[str, str]:
    """:func:`~warcore_sglang.serving.harness.cpu_env` plus what PD needs on a CPU."""
    return {
        **harness.cpu_env(),
        "SGLANG_HOST_IP": "127.0.0.1",
        "WARCORE_SGLANG_PD_STANDIN": "1",
    }


def side_argv(model: Path, mode: str, bootstrap_port: int, **overrides: Any) -> list[str]:
    """``launch_server`` flags for one side (``prefill`` or ``decode``)."""
    args: dict[str, Any] = {
        "disaggregation_mode": mode,
        "disaggregation_transfer_backend": BACKEND,
    }
    if mode == "prefill":
        args["disaggregation_bootstrap_port"] = bootstrap_port
    else:
        args["disaggregation_decode_retraction_backup"] = "cpu_tensor"
    return harness.cpu_server_argv(model, **args, **overrides)


def _request(url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read())


class Router:
    """``python -m sglang_router.launch_router --pd-disaggregation`` on 127.0.0.1, stopped by
    pid; :meth:`start` returns once both servers are registered with it."""

    def __init__(self, prefill: str, bootstrap_port: int, decode: str, workdir: Path) -> None:
        self.port = harness.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(workdir) / "router.log"
        self.argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        self.argv += ["--prefill", prefill, str(bootstrap_port), "--decode", decode]
        self.argv += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warn"]
        # its metrics exporter binds 0.0.0.0:29000 unless told: a second router fails there
        self.argv += ["--prometheus-host", "127.0.0.1"]
        self.argv += ["--prometheus-port", str(harness.free_port())]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> Router:
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(self.argv, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PdError(f"the router exited {self.process.returncode}: {self.tail()}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                workers = _request(self.url + "/workers", None, 2.0)
                if len(workers.get("workers", [])) >= 2:
                    return self
            time.sleep(0.5)
        self.stop()
        raise PdError(f"the router did not register both servers in {timeout:g} s: {self.tail()}")

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return f"log {self.log}:\n" + "\n".join(lines[-20:])

    def stop(self) -> None:
        if self.process is not None:
            harness.stop_tree(self.process)


def _generate(url: str, request: harness.Request, timeout: float) -> list[int]:
    body = {
        "input_ids": request.input_ids,
        "rid": request.rid,
        "sampling_params": {
            "max_new_tokens": request.max_new_tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
    }
    return list(_request(url + "/generate", body, timeout)["output_ids"])


def generate_each(
    url: str, requests: list[harness.Request], concurrency: int = 1, timeout: float = 120.0
) -> dict[str, list[int]]:
    """One ``POST /generate`` per request (the router takes one prompt a request), at most
    ``concurrency`` at once; rid -> output ids."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = {r.rid: pool.submit(_generate, url, r, timeout) for r in requests}
        return {rid: f.result() for rid, f in futures.items()}


@dataclass
class Pair:
    """A prefill and a decode server (HTTP, their logs in ``workdir``) and the router."""

    prefill: harness.HttpServer
    decode: harness.HttpServer
    router: Router
    bootstrap_port: int
    startup_s: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.router.url

    def stop(self) -> None:
        self.router.stop()
        self.prefill.stop()
        self.decode.stop()


def _start_both(servers: list[harness.HttpServer], timeout: float) -> None:
    failed: list[BaseException] = []

    def start(server: harness.HttpServer) -> None:
        try:
            server.start(timeout=timeout)
        except BaseException as exc:  # said below, with the other side stopped
            failed.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        for server in servers:
            server.stop()
        raise failed[0]


@contextlib.contextmanager
def started(
    model: Path,
    workdir: Path,
    *,
    prefill_env: dict[str, str],
    decode_env: dict[str, str],
    decode_args: dict[str, Any] | None = None,
    timeout: float = 420.0,
) -> Iterator[Pair]:
    """Both sides started at once (each bounded by ``timeout``), then the router; everything
    stopped by pid on exit, whatever happened."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = harness.free_port()
    sides = {
        "prefill": harness.HttpServer(
            side_argv(model, "prefill", port),
            module=LAUNCHER,
            env=prefill_env,
            workdir=workdir,
            name="prefill",
        ),
        "decode": harness.HttpServer(
            side_argv(model, "decode", port, **(decode_args or {})),
            module=LAUNCHER,
            env=decode_env,
            workdir=workdir,
            name="decode",
        ),
    }
    begin = time.monotonic()
    _start_both(list(sides.values()), timeout)
    router = Router(sides["prefill"].url, port, sides["decode"].url, workdir)
    pair = Pair(sides["prefill"], sides["decode"], router, port)
    try:
        router.start()
        pair.startup_s = {"pair": time.monotonic() - begin}
        yield pair
    finally:
        pair.stop()
