"""Two sglang "nodes" on this machine for ``test_nodes.py``: sglang 0.5.23's multi-node launch
(``--nnodes 2 --node-rank 0|1 --dist-init-addr 127.0.0.1:PORT``) as two separate process trees,
each started on its own by ``python -m warcore_sglang.serving.launch_server`` with its own
environment
(its own ``WARCORE_PLUGINS``, trace file and CPU core), as two machines would be.

:func:`run_nodes` starts both at once and waits, bounded, until each node answers ``/health``
(node 0 serves HTTP; a node of rank >= 1 runs no tokenizer and answers from sglang's dummy
health server once its schedulers are ready) or exits. Where both answer, the waves go to node 0
and both trees are stopped by pid. Where a node exits, every process of both trees must end by
itself within :data:`ENDED_WITHIN` seconds; the ones that did not are recorded, then stopped
by pid. Every process is stopped by pid whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _servers import TIMEOUT
from warcore_sglang.audit import trace
from warcore_sglang.serving import harness as serving

MODES: dict[str, dict[str, Any]] = {
    "tp": {"tp_size": 2},
    "pp": {"pp_size": 2},
    "dp_attention": {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True},
}
"""sglang's flags per parallel mode; each node holds one rank of the two."""

BACKEND = "fork_native"
"""The out-of-tree backend of ``dists/sglang_fork_attn``: ``fork_late`` changes its prefill
decision, so a node without ``fork_late`` decides that cell differently."""

PORTS_CHOSEN = "server_args="
"""What a launcher logs right after sglang chose (and checked) its ports."""
STAGGERED = {"dp_attention"}
"""Modes whose node 1 must choose its ports before node 0 starts: under DP attention every node
derives its ports from ``--dist-init-addr`` (``PortArgs.init_new``) and waits up to 30 s for
each to be free on its own host; on one host node 0 holds them once it is up, and node 1 then
fails (``ValueError: port_base at N is not available in 30 seconds``)."""

ENDED_WITHIN = 90.0
"""Seconds every process of both trees has to end by itself once a node exited."""

NODE_ENV = {
    "WARCORE_SGLANG_CHECK_RANKS": "1",
    "WARCORE_FORCE_COARSE": "",
    # sglang's crash handler waits 60 s for CUDA core dumps (and tries py-spy) before a
    # failed server exits; there is neither here
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
}


@dataclass
class Node:
    """One node: its launcher process tree, log and trace."""

    rank: int
    argv: list[str]
    env: dict[str, str]
    log: Path
    trace_path: Path
    process: subprocess.Popen[bytes] | None = None
    healthy_s: float | None = None
    returncode: int | None = None
    records: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.port = serving.free_port()
        self.pids: list[int] = []

    def launch(self) -> None:
        self.trace_path.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "warcore_sglang.serving.launch_server", *self.argv]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env, cwd=self.log.parent
            )

    def poll(self, started: float) -> bool:
        """Note the tree's pids; true once the node answered ``/health`` or exited."""
        assert self.process is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.process.pid)
            tree = [root.pid, *(p.pid for p in root.children(recursive=True))]
            self.pids = sorted({*self.pids, *tree})
        if self.process.poll() is not None:
            self.returncode = self.process.returncode
            return True
        if self.healthy_s is not None:
            return True
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply,
        ):
            if reply.status == 200:
                self.healthy_s = time.monotonic() - started
                return True
        return False

    def alive(self) -> list[int]:
        return [p for p in self.pids if _running(p)]

    def stop(self) -> None:
        if self.process is not None:
            serving.stop_tree(self.process, known=self.pids)
            self.returncode = self.process.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _running(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


@dataclass
class NodesRun:
    """What the two nodes did."""

    mode: str
    plugins: tuple[str, str]
    nodes: list[Node]
    tokens: dict[str, list[int]]
    seconds: float
    left_running: list[int]
    """Pids still running :data:`ENDED_WITHIN` s after a node exited (stopped by us then)."""
    ended_s: float | None
    """Seconds from the start until every process of both trees had ended by itself."""

    def kind(self, rank: int, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.nodes[rank].records or [] if r.get("kind") == kind]

    def schedulers(self, rank: int) -> list[dict[str, Any]]:
        return [r for r in self.kind(rank, "process") if r["role"] == "scheduler"]


def _nodes(mode: str, plugins: tuple[str, str], model: Path, work: Path) -> list[Node]:
    dist = f"127.0.0.1:{serving.free_port()}"
    nodes = []
    for rank, allowed in enumerate(plugins):
        argv = serving.cpu_server_argv(model, attention_backend=BACKEND, **MODES[mode])
        argv += ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", dist]
        trace_path = work / f"node{rank}.trace.jsonl"
        env = {**os.environ, **serving.cpu_env(), **NODE_ENV, "WARCORE_PLUGINS": allowed}
        # each node binds its own core, as each machine would its own
        env |= {"SGLANG_CPU_OMP_THREADS_BIND": str(rank), trace.ENV_TRACE: str(trace_path)}
        nodes.append(Node(rank, argv, env, work / f"node{rank}.log", trace_path))
    return nodes


def run_nodes(
    mode: str,
    plugins: tuple[str, str],
    model: Path,
    work: Path,
    waves: list[list[serving.Request]],
) -> NodesRun:
    """Start the two nodes of ``mode`` with ``WARCORE_PLUGINS`` ``plugins[rank]`` on each; serve
    ``waves`` through node 0 if both come up."""
    work.mkdir(parents=True, exist_ok=True)
    nodes = _nodes(mode, plugins, model, work)
    start = time.monotonic()
    tokens: dict[str, list[int]] = {}
    left: list[int] = []
    ended_s = None
    try:
        _launch(nodes, staggered=mode in STAGGERED, start=start)
        while not _settled(nodes, start):
            if time.monotonic() > start + TIMEOUT:
                raise serving.ServerError(f"{mode} nodes: neither up nor ended in {TIMEOUT:.0f} s")
            time.sleep(0.5)
        if all(n.healthy_s is not None for n in nodes):
            # HttpServer's POST /generate, pointed at node 0
            server = serving.HttpServer([], workdir=work)
            server.url = f"http://127.0.0.1:{nodes[0].port}"
            for wave in waves:
                tokens |= server.generate(wave)
        else:
            ended_s, left = _wait_ended(nodes, time.monotonic() + ENDED_WITHIN, start)
    finally:
        for node in nodes:
            node.stop()
    for node in nodes:
        node.records = trace.read_trace(node.trace_path) if node.trace_path.is_file() else []
    return NodesRun(mode, plugins, nodes, tokens, time.monotonic() - start, left, ended_s)


def _launch(nodes: list[Node], *, staggered: bool, start: float) -> None:
    """Both nodes at once, or (``staggered``) node 1 first and node 0 once node 1 chose its
    ports (bounded)."""
    if not staggered:
        for node in nodes:
            node.launch()
        return
    nodes[1].launch()
    while PORTS_CHOSEN not in nodes[1].text() and not nodes[1].poll(start):
        if time.monotonic() > start + TIMEOUT:
            raise serving.ServerError(f"node 1 chose no ports in {TIMEOUT:.0f} s")
        time.sleep(0.5)
    nodes[0].launch()


def _settled(nodes: list[Node], start: float) -> bool:
    """True once every node answered ``/health``, or one of them exited."""
    done = [n.poll(start) for n in nodes]
    return all(done) or any(n.returncode is not None for n in nodes)


def _wait_ended(nodes: list[Node], deadline: float, start: float) -> tuple[float | None, list[int]]:
    """Wait until every process either node started has ended by itself (at most until
    ``deadline``); returns when they had, from ``start``, and the pids still running."""
    while time.monotonic() < deadline:
        for node in nodes:
            node.poll(start)
        left = [p for n in nodes for p in n.alive()]
        if not left:
            return time.monotonic() - start, []
        time.sleep(0.5)
    return None, [p for n in nodes for p in n.alive()]
