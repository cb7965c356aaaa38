"""A local Ray cluster on this CPU and the ``RayEngine`` runs the Ray tests assert on.

The cluster (:func:`start_cluster`): ``ray.cluster_utils.Cluster`` in this process, two nodes
on 127.0.0.1 (the head with two logical GPUs, a second node with one: Ray's ``num_gpus`` is a
count it schedules by, nothing here touches a device), each with an 80 MiB object store (Ray's
minimum is 75 MiB; nothing large travels). Its raylets, and so every worker, get
:func:`cluster_env`: the serving path's CPU environment, no ``WARCORE_*`` variable (each run's
driver carries its own to its actors), ``SGLANG_CPU_OMP_THREADS_BIND``.

Each run (:func:`run`) is a driver process of its own (``_driver.py``): Ray shares the cluster
between drivers, and sglang loads plugins once per process (one run with warcore, one without).
Every wait is bounded, every process started is stopped by its pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warcore_sglang.audit import trace
from warcore_sglang.serving import harness

TIMEOUT = float(os.environ.get("WARCORE_SGLANG_SERVER_TIMEOUT", "300"))
"""Seconds one run may take, its driver's start to its engine's shutdown."""
DRIVER = Path(__file__).with_name("_driver.py")
STORE = 80 * 2**20
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_ENABLE_AUTO_CONNECT": "0"}
"""Ray on 127.0.0.1 only: Ray turns a loopback address given to ``ray.init`` into the
machine's own address unless its cluster mode is off (this variable: Ray's choice on macOS
and Windows), and a driver never starts a cluster of its own (sglang's ``atexit`` shutdown
after the driver's ``ray.shutdown()`` would)."""
WAVES = harness.two_waves(3, 6)


def cluster_env() -> dict[str, str]:
    env = {**harness.cpu_env(), **LOOPBACK}
    # each rank's cores (sglang's CPU path refuses more ranks than NUMA nodes without it); a
    # rank's entry is picked by the GPU id Ray gave it on its node
    env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    return env


@dataclass
class Cluster:
    cluster: Any
    address: str
    temp: str
    pids: list[int] = field(default_factory=list)

    def raylets(self) -> dict[int, str]:
        """raylet pid -> the node it is (``head``, ``node2``)."""
        nodes = [
            ("head", self.cluster.head_node),
            *(("node2", n) for n in self.cluster.worker_nodes),
        ]
        return {
            info.process.pid: name
            for name, node in nodes
            for info in node.all_processes.get("raylet", [])
        }


def start_cluster() -> Cluster:
    """The two-node cluster, this process's environment set for its nodes first."""
    import psutil

    os.environ.update(cluster_env())
    for name in [k for k in os.environ if k.startswith("WARCORE_SGLANG")]:
        if name != "WARCORE_SGLANG_STANDINS":
            del os.environ[name]
    from ray.cluster_utils import Cluster as RayCluster

    # a short folder: Ray's unix sockets live there (their paths hold at most 107 bytes)
    temp = tempfile.mkdtemp(prefix="wray", dir="/tmp")
    # Ray notes the cluster's address in <TMPDIR>/ray (nox points TMPDIR to a fresh folder)
    os.makedirs(os.path.join(tempfile.gettempdir(), "ray"), exist_ok=True)
    node = {"node_ip_address": "127.0.0.1", "object_store_memory": STORE, "temp_dir": temp}
    head = {**node, "num_cpus": 2, "num_gpus": 2, "include_dashboard": False}
    started = Cluster(None, "", temp)
    try:
        started.cluster = RayCluster(
            initialize_head=True, head_node_args=head, shutdown_at_exit=False
        )
        started.address = started.cluster.address
        started.cluster.add_node(**node, num_cpus=2, num_gpus=1)
    except BaseException:
        stop_cluster(started)
        raise
    started.pids = [p.pid for p in psutil.Process().children(recursive=True)]
    return started


def stop_cluster(started: Cluster) -> None:
    """Every node's processes, then whatever of them is left, by pid."""
    import shutil

    import psutil

    known = {*started.pids, *(p.pid for p in psutil.Process().children(recursive=True))}
    try:
        if started.cluster is not None:
            started.cluster.shutdown()
    finally:
        left = []
        for pid in known:
            try:
                process = psutil.Process(pid)
                process.kill()
                left.append(process)
            except psutil.Error:
                continue
        psutil.wait_procs(left, timeout=15)
        shutil.rmtree(started.temp, ignore_errors=True)


@dataclass
class Run:
    name: str
    tokens: dict[str, list[int]]
    records: list[dict[str, Any]]
    log: str
    seconds: float
    returncode: int | None = 0

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def said(self, text: str) -> list[str]:
        """The driver's output lines holding ``text`` (Ray forwards each actor's output)."""
        return [ln for ln in Path(self.log).read_text(errors="replace").splitlines() if text in ln]


@dataclass
class Runs:
    runs: dict[str, Run | Exception]
    raylets: dict[int, str]
    """Each node's raylet pid -> its name (``head``, ``node2``)."""

    def __getitem__(self, name: str) -> Run:
        found = self.runs[name]
        if isinstance(found, Exception):
            raise found
        return found


def run(
    started: Cluster,
    root: Path,
    name: str,
    engine: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    runtime_env: dict[str, Any] | None = None,
    fails: bool = False,
) -> Run:
    """One driver: ``RayEngine(**engine)`` on the cluster, the waves, a trace
    (``WARCORE_SGLANG_TRACE``, read whether or not warcore is asked). ``fails``: the driver is
    expected to end without a result (its exit status is returned)."""
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    path, out, log = work / "trace.jsonl", work / "out.json", work / "driver.log"
    spec = {
        "address": started.address,
        "engine": engine,
        "waves": [[r.__dict__ for r in wave] for wave in WAVES],
        "out": str(out),
        "runtime_env": runtime_env or {},
    }
    (work / "spec.json").write_text(json.dumps(spec))
    child_env = {**os.environ, **(env or {}), trace.ENV_TRACE: str(path)}
    start = time.monotonic()
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, str(DRIVER), str(work / "spec.json")],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=str(work),
        )
    # the driver's own children (sglang's detokenizer) are noted while it runs: one left
    # behind when the driver ends is stopped by its pid with the rest
    known: list[int] = []
    try:
        harness.watch_tree(child, start + TIMEOUT, known)
    finally:
        harness.stop_tree(child, known=known)
    seconds = time.monotonic() - start
    records = trace.read_trace(path) if path.is_file() else []
    if fails:
        return Run(name, {}, records, str(log), seconds, child.returncode)
    if child.returncode != 0 or not out.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise harness.ServerError(f"{name}: exited {child.returncode}; log {log}:\n{tail}")
    return Run(name, json.loads(out.read_text())["tokens"], records, str(log), seconds)


def engine_args(model: Path, **overrides: Any) -> dict[str, Any]:
    """The tiny model on the CPU, as ``RayEngine`` arguments (``log_level`` info: each actor's
    start-up line is logged through sglang's logger)."""
    return harness.cpu_engine_args(model, log_level="info", **overrides)


def broken_warcore_sglang(root: Path) -> Path:
    """A folder holding a ``warcore_sglang`` package whose import fails: first on an actor's
    ``PYTHONPATH``, it stands for a node where warcore-sglang cannot be imported."""
    package = root / "broken" / "warcore_sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        'raise ImportError("warcore-sglang is broken on this node (a stand-in of the test)")\n'
    )
    return package.parent
