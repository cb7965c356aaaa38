"""Run a real sglang server, bounded: the ``Engine`` API or the HTTP server, in their own
processes, with a tiny random-weight model on a CPU. Used by the real-server tests, the
sanitizer command and the server benchmark.

* :func:`write_tiny_model`: a Llama-style model directory (``config.json`` and a seeded
  ``model.safetensors``, 0.8 MB; nothing is downloaded). Why not ``load_format="dummy"``:
  sglang's dummy loader sets every weight, the norms' included, uniform in +-1e-3; attention's
  contribution then vanishes below the dtype's precision and the tokens depend on the current
  token alone (measured: four prompts ending in the same token gave the same 8 tokens), so no
  poisoned ``req_to_token`` row could ever change them. These weights keep the norms at 1 and
  the projections at unit gain.
* :func:`cpu_env` / :func:`cpu_engine_args` / :func:`cpu_server_argv`: what sglang's serving
  path needs on a CPU (REFERENCE: ``SGLANG_USE_CPU_ENGINE=1``, ``SGLANG_ENABLE_WAR_BARRIER=1``,
  ``torch_native``, no CUDA graphs, the import-only stand-ins on ``PYTHONPATH``).
* :func:`run_engine`: a child process builds ``sglang.Engine(**kwargs)``, runs waves of
  requests (input ids in, output ids out; a wave starts when the previous one finished, so its
  requests reuse the ``req_to_token`` rows the previous wave freed), writes the tokens and the
  timings, and shuts the engine down. The parent waits at most ``timeout`` seconds and then
  stops the child and every process it started, by pid.
* :class:`HttpServer`: ``python -m warcore_sglang.serving.launch_server`` (or sglang's launcher) on
  127.0.0.1 with a free port; bounded waits for ``/health``, ``POST /generate``, stopped by pid.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SERVING_MODULES",
    "missing_for_serving",
    "HttpServer",
    "Request",
    "ServerError",
    "cpu_engine_args",
    "cpu_env",
    "cpu_server_argv",
    "free_port",
    "parse_engine_args",
    "run_engine",
    "run_refused_engine",
    "run_waves",
    "stop_tree",
    "tagged",
    "two_waves",
    "watch_tree",
    "write_tiny_model",
]

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
}

BOOT = Path(__file__).resolve().parents[2] / "tests" / "_boot"
"""The CPU stand-ins' boot folder in a source checkout (absent from an installed wheel)."""
STANDINS = "triton,torchvision,sgl_kernel"


SERVING_MODULES = ("sglang", "torch", "safetensors", "psutil")
"""What running a real sglang server here imports besides the standard library."""


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_for_serving() -> str | None:
    """``None`` when a real sglang server can be started from this environment, else one line
    saying what is missing and how to get it."""
    missing = [m for m in SERVING_MODULES if not _found(m)]
    if not missing:
        return None
    return (
        f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: a real "
        "sglang 0.5.23 server needs its serving path (pip install --no-deps -r "
        "plugins/sglang/sglang-0.5.23-server-pins.txt beside torch, or run in the venv "
        "nox -s sglang_server builds; plugins/sglang/README.md)"
    )


class ServerError(RuntimeError):
    """A server process failed, or did not answer in time; the message holds its log's tail."""


@dataclass(frozen=True)
class Request:
    rid: str
    input_ids: list[int]
    max_new_tokens: int


# -- the model and the switches -------------------------------------------------------------


def write_tiny_model(directory: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny model to ``directory`` (idempotent for one seed); returns the path."""
    import torch
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    config = json.dumps(TINY_CONFIG, indent=1, sort_keys=True)
    weights = d / "model.safetensors"
    stamp = d / ".warcore-seed"
    fresh = (d / "config.json").is_file() and weights.is_file() and stamp.is_file()
    if fresh and stamp.read_text() == f"{seed}\n{config}":
        return d
    c = TINY_CONFIG
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv_heads, head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    g = torch.Generator().manual_seed(seed)

    def linear(out: int, inp: int, gain: float = 1.0) -> Any:
        return torch.randn(out, inp, generator=g) * (gain / inp**0.5)

    tensors = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": linear(vocab, hidden),
    }
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            # q and k at twice the gain: attention that picks tokens, not a uniform average
            p + "self_attn.q_proj.weight": linear(heads * head_dim, hidden, 2.0),
            p + "self_attn.k_proj.weight": linear(kv_heads * head_dim, hidden, 2.0),
            p + "self_attn.v_proj.weight": linear(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": linear(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": linear(inter, hidden),
            p + "mlp.up_proj.weight": linear(inter, hidden),
            p + "mlp.down_proj.weight": linear(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    (d / "config.json").write_text(config + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights))
    stamp.write_text(f"{seed}\n{config}")
    return d


def cpu_env(boot: Path | None = None) -> dict[str, str]:
    """The environment sglang's serving path needs on a CPU-only machine, every child
    included: the CPU engine, the WAR barrier on without CUDA, the stand-ins, one OpenMP
    thread per process (unless ``OMP_NUM_THREADS`` is set), and only the Llama model module
    imported at start-up (unless ``SGLANG_DISABLED_MODEL_ARCHS`` is set)."""
    env = {
        # One intra-op thread per process: on two shared cores torch's OpenMP threads spin
        # against each other and the other processes (measured, back to back with the default
        # two: 39-53 decode tokens/s in one run, ~1000 in the next; with one: 1115-1260).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_ENABLE_WAR_BARRIER": "1",
        "WARCORE_SGLANG_STANDINS": STANDINS,
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    }
    if "SGLANG_DISABLED_MODEL_ARCHS" not in os.environ:
        env["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(_model_modules_but(("llama",)))
    boot = BOOT if boot is None else boot
    if boot.is_dir():
        parts = [str(boot), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def _model_modules_but(keep: tuple[str, ...]) -> list[str]:
    """sglang's model modules (found without importing sglang) other than ``keep``. sglang
    imports every one of them (255 in 0.5.23) in each process that builds its model registry;
    ``SGLANG_DISABLED_MODEL_ARCHS``, sglang's own switch, skips them (measured here under load:
    that import took 18 s of CPU with all of them, 13 s with the Llama module alone)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return []
    models = Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"
    skip = {*keep, "__init__", "registry"}
    return sorted(p.stem for p in models.glob("*.py") if p.stem not in skip)


def cpu_engine_args(model: str | os.PathLike[str], **overrides: Any) -> dict[str, Any]:
    """``sglang.Engine`` arguments for the tiny model on a CPU (no radix cache: a repeated
    prompt runs the same prefill again, so a rerun is comparable token for token)."""
    args: dict[str, Any] = {
        "model_path": str(model),
        "skip_tokenizer_init": True,
        "device": "cpu",
        "attention_backend": "torch_native",
        "disable_cuda_graph": True,
        "mem_fraction_static": 0.1,
        "max_total_tokens": 4096,
        "random_seed": 0,
        "disable_radix_cache": True,
        "log_level": "info",
    }
    args.update(overrides)
    return args


def cpu_server_argv(model: str | os.PathLike[str], **overrides: Any) -> list[str]:
    """The same as :func:`cpu_engine_args`, as ``launch_server`` flags."""
    argv: list[str] = []
    for key, value in cpu_engine_args(model, **overrides).items():
        flag = "--" + key.replace("_", "-")
        if key == "disable_cuda_graph":
            argv += ["--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"]
        elif value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def parse_engine_args(argv: list[str]) -> dict[str, Any]:
    """``--field-name VALUE`` / ``--flag`` (sglang's ``ServerArgs`` field names, dashes for
    underscores) -> ``Engine`` keyword arguments; a VALUE is read as JSON when it parses."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ValueError(f"expected --name [VALUE], got {arg!r}")
        key = arg[2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raw = argv[i + 1]
            try:
                out[key] = json.loads(raw)
            except json.JSONDecodeError:
                out[key] = raw
            i += 2
        else:
            out[key] = True
            i += 1
    return out


# -- the workload ---------------------------------------------------------------------------


def two_waves(n: int = 6, new_tokens: int = 12, seed: int = 0) -> list[list[Request]]:
    """Two waves of ``n`` requests with prompts of different lengths (4 to 40 tokens). The
    second starts after the first finished: its requests take the rows the first freed."""
    import random

    rng = random.Random(seed)
    waves = []
    for w in (1, 2):
        wave = []
        for k in range(n):
            length = 4 + (k * 7 + w * 3) % 37
            ids = [rng.randrange(3, TINY_CONFIG["vocab_size"]) for _ in range(length)]
            wave.append(Request(f"w{w}-{k}", ids, new_tokens))
        waves.append(wave)
    return waves


def tagged(waves: list[list[Request]], tag: str) -> list[list[Request]]:
    """The same waves again, each rid prefixed with ``tag-``."""
    return [[Request(f"{tag}-{r.rid}", r.input_ids, r.max_new_tokens) for r in w] for w in waves]


# -- processes ------------------------------------------------------------------------------


def free_port() -> int:
    """A port of 127.0.0.1 free now, for a server that binds it later (tens of seconds, on
    these cores): picked below the kernel's ephemeral range, where no other process's
    ``connect()`` or ``bind(0)`` can take it meanwhile (a two-node CI run lost its HTTP port
    that way: ``[Errno 98] address already in use``), and below the 22000-29999 where sglang
    picks its own ports the same way (``get_free_port_below_ephemeral``)."""
    for port in random.sample(range(_PORTS_FROM, _ports_below()), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # nothing free down there: any port, as the kernel picks it
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PORTS_FROM, _SGLANGS_FROM = 10000, 22000


def _ports_below() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            ephemeral_from = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 32768  # the kernel's default
    return max(min(_SGLANGS_FROM, ephemeral_from), _PORTS_FROM + 64)


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(
    root: subprocess.Popen[bytes], grace: float = 15.0, known: list[int] | None = None
) -> list[int]:
    """Stop the process ``root`` started and every process below it (and the ``known`` pids,
    in case they were orphaned already): SIGTERM each, wait at most ``grace`` seconds, then
    SIGKILL what is left. Returns the pids that were still alive.

    ``root`` is waited for through its ``Popen`` alone: a psutil wait on a child of this process
    reaps it, and the ``Popen`` then answers the ``ECHILD`` with exit status 0 (CPython's
    documented fallback), a clean exit that never happened."""
    import psutil

    if not isinstance(root, subprocess.Popen):  # a pid, as stop_tree took before 2026-12-05
        raise TypeError(
            f"stop_tree: root must be the subprocess.Popen that started the process, not "
            f"{type(root).__name__} {root!r} (its exit status is read through the Popen)"
        )
    running = root.poll() is None
    # once reaped, root's pid may belong to another process: only its recorded tree counts
    procs = _tree(root.pid)[1:] if running else []
    for extra in known or []:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(extra)
            if p.pid != root.pid and p not in procs:
                procs.append(p)
    alive = ([root.pid] if running else []) + [p.pid for p in procs if p.is_running()]
    if running:
        root.send_signal(signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    _, rest = psutil.wait_procs(procs, timeout=grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        root.wait(timeout=max(0.0, deadline - time.monotonic()))
    if root.poll() is None:
        root.kill()
    for p in rest:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(rest, timeout=grace)
    with contextlib.suppress(subprocess.TimeoutExpired):
        root.wait(timeout=grace)
    return alive


def _tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _spawn(
    engine_args: dict[str, Any],
    waves: list[list[Request]],
    env: dict[str, str] | None,
    workdir: str | os.PathLike[str],
    name: str,
    python: str | None,
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The child of :func:`run_engine`, started: (its process, its result file, its log)."""
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    spec = work / f"{name}.spec.json"
    out = work / f"{name}.out.json"
    log = work / f"{name}.log"
    out.unlink(missing_ok=True)
    spec.write_text(
        json.dumps(
            {
                "engine": engine_args,
                "waves": [[r.__dict__ for r in w] for w in waves],
                "out": str(out),
            }
        )
    )
    with log.open("wb") as sink:
        child = subprocess.Popen(
            [python or sys.executable, "-m", "warcore_sglang.serving.harness", str(spec)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=str(work),
        )
    return child, out, log


def watch_tree(child: subprocess.Popen[bytes], deadline: float, known: list[int]) -> bool:
    """Wait for ``child`` until ``deadline`` (monotonic), noting every pid of its tree in
    ``known``; whether it exited."""
    while child.poll() is None and time.monotonic() < deadline:
        known[:] = sorted({*known, *(p.pid for p in _tree(child.pid)[1:])})
        time.sleep(0.5)
    return child.poll() is not None


def run_engine(
    engine_args: dict[str, Any],
    waves: list[list[Request]],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    workdir: str | os.PathLike[str],
    name: str = "engine",
    python: str | None = None,
) -> dict[str, Any]:
    """Run the waves on ``sglang.Engine(**engine_args)`` in a child process; returns its
    result: ``tokens`` (rid -> output ids), ``startup_s`` (the ``Engine`` constructor),
    ``scheduler_startup_s`` (the scheduler child's life until the engine was ready),
    ``wave_s``, the pids, and ``log`` (the path of its stdout and stderr)."""
    child, out, log = _spawn(engine_args, waves, env, workdir, name, python)
    known: list[int] = []
    try:
        if not watch_tree(child, time.monotonic() + timeout, known):
            raise ServerError(f"{name}: no result within {timeout:.0f} s; log {log}:\n{_tail(log)}")
    finally:
        stop_tree(child, known=known)
    if child.returncode != 0 or not out.is_file():
        raise ServerError(f"{name}: exited {child.returncode}; log {log}:\n{_tail(log)}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["log"] = str(log)
    return result


def run_refused_engine(
    engine_args: dict[str, Any],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300.0,
    grace: float = 30.0,
    workdir: str | os.PathLike[str],
    name: str = "engine",
) -> dict[str, Any]:
    """Start ``sglang.Engine(**engine_args)`` in a child process expecting its start-up to
    fail: returns ``returncode``, ``seconds`` (until the child exited by itself), ``leftover``
    (the pids of its process tree still alive ``grace`` seconds later, then stopped: a process
    a failed start-up left hanging) and ``log``. Raises :class:`ServerError` when the child did
    not exit within ``timeout`` or started serving."""
    started = time.monotonic()
    child, out, log = _spawn(engine_args, [], env, workdir, name, None)
    known: list[int] = []
    try:
        if not watch_tree(child, started + timeout, known):
            raise ServerError(f"{name}: still starting after {timeout:.0f} s; log {log}")
        seconds = time.monotonic() - started
        end = time.monotonic() + grace
        while time.monotonic() < end and any(_alive(pid) for pid in known):
            time.sleep(0.5)
        leftover = [pid for pid in known if _alive(pid)]
    finally:
        stop_tree(child, known=known)
    if child.returncode == 0 or out.is_file():
        raise ServerError(f"{name}: started and served; log {log}")
    return {
        "returncode": child.returncode,
        "seconds": seconds,
        "leftover": leftover,
        "pids": known,
        "log": str(log),
    }


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def run_waves(
    engine: Any, waves: list[list[dict[str, Any]]], tokens: dict[str, Any], seconds: list[float]
) -> None:
    """Each wave (requests as dicts) on an ``sglang.Engine`` (or ``RayEngine``), greedy, one
    after the other: each request's output ids into ``tokens``, each wave's time into
    ``seconds``."""
    for wave in waves:
        start = time.monotonic()
        outputs = engine.generate(
            input_ids=[r["input_ids"] for r in wave],
            sampling_params=[
                {"max_new_tokens": r["max_new_tokens"], "temperature": 0, "ignore_eos": True}
                for r in wave
            ],
            rid=[r["rid"] for r in wave],
        )
        seconds.append(time.monotonic() - start)
        if isinstance(outputs, dict):
            outputs = [outputs]
        for r, o in zip(wave, outputs, strict=True):
            tokens[r["rid"]] = list(o["output_ids"])


def _engine_child(spec_path: str) -> None:
    """The child of :func:`run_engine`."""
    import psutil

    spec = json.loads(Path(spec_path).read_text())
    t0 = time.monotonic()
    import sglang

    imported = time.monotonic()
    engine = sglang.Engine(**spec["engine"])
    ready = time.monotonic()
    wall_ready = time.time()
    scheduler = [p for p in psutil.Process().children(recursive=True) if "scheduler" in _name(p)]
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "children": [p.pid for p in psutil.Process().children(recursive=True)],
        "scheduler_pids": [p.pid for p in scheduler],
        "import_s": imported - t0,
        "startup_s": ready - imported,
        "scheduler_startup_s": (
            wall_ready - min(p.create_time() for p in scheduler) if scheduler else None
        ),
        "tokens": {},
        "wave_s": [],
    }
    try:
        run_waves(engine, spec["waves"], result["tokens"], result["wave_s"])
    finally:
        engine.shutdown()
    Path(spec["out"]).write_text(json.dumps(result))


def _name(p: Any) -> str:
    with contextlib.suppress(Exception):
        return str(p.name()) + " " + " ".join(p.cmdline()[:1])
    return ""


class HttpServer:
    """An sglang HTTP server process on 127.0.0.1 (a context manager: stopped by pid on exit,
    whatever happened)."""

    def __init__(
        self,
        argv: list[str],
        *,
        module: str = "warcore_sglang.serving.launch_server",
        env: dict[str, str] | None = None,
        workdir: str | os.PathLike[str],
        name: str = "http",
        python: str | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work = Path(workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = self.work / f"{name}.log"
        self.argv = [python or sys.executable, "-m", module, *argv]
        self.argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self.startup_s: float | None = None

    def __enter__(self) -> HttpServer:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 300.0) -> HttpServer:
        """Start the server and wait for ``/health`` (at most ``timeout`` seconds); on any
        failure, whatever it started is stopped before the error is raised."""
        start = time.monotonic()
        sink = self.log.open("wb")
        try:
            self.process = subprocess.Popen(
                self.argv, stdout=sink, stderr=subprocess.STDOUT, env=self.env, cwd=self.work
            )
        finally:
            sink.close()
        try:
            self._wait_healthy(start + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - start
        return self

    def _wait_healthy(self, deadline: float) -> None:
        assert self.process is not None
        while time.monotonic() < deadline:
            self.pids = sorted({*self.pids, *(p.pid for p in _tree(self.process.pid))})
            if self.process.poll() is not None:
                raise ServerError(
                    f"{self.argv[2]} exited {self.process.returncode} before /health "
                    f"answered; log {self.log}:\n{_tail(self.log)}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.5)
        raise ServerError(f"/health did not answer in time; log {self.log}:\n{_tail(self.log)}")

    def generate(self, requests: list[Request], timeout: float = 120.0) -> dict[str, list[int]]:
        """One ``POST /generate`` for the batch; rid -> output ids."""
        body = {
            "input_ids": [r.input_ids for r in requests],
            "rid": [r.rid for r in requests],
            "sampling_params": [
                {"max_new_tokens": r.max_new_tokens, "temperature": 0, "ignore_eos": True}
                for r in requests
            ],
        }
        request = urllib.request.Request(
            self.url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            outputs = json.loads(reply.read())
        if isinstance(outputs, dict):
            outputs = [outputs]
        return {r.rid: list(o["output_ids"]) for r, o in zip(requests, outputs, strict=True)}

    def stop(self) -> None:
        if self.process is not None:
            stop_tree(self.process, known=self.pids)


if __name__ == "__main__":
    _engine_child(sys.argv[1])
