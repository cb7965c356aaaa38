"""One ``RayEngine`` on a running Ray cluster: the child process the Ray tests start
(``python _driver.py SPEC``), a Ray driver of its own.

It connects to the cluster at the spec's address, builds ``sglang.srt.ray.engine.RayEngine``
with the spec's arguments, runs the waves (greedy), writes the tokens and shuts the engine
down. Two stand-ins of the test harness, both for this CPU (docs/sglang-ray.md):

* the job's ``worker_process_setup_hook`` (:func:`cpu_actor`, pickled by value into every worker
  of this job) makes ``torch.cuda.set_device`` a no-op: ``SchedulerActor.run_event_loop`` calls
  it with the GPU id Ray assigned, and a CPU build of torch has no ``_cuda_setDevice``;
* a watchdog thread ends this process at once, naming the actor, when a scheduler actor's event
  loop ends while the engine runs: sglang's ``RayEngine`` does not watch its actors (a forked
  scheduler that dies signals its parent; an actor that dies leaves every request waiting).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def cpu_actor() -> None:
    """In every worker of the job: ``torch.cuda.set_device`` does nothing (CPU torch)."""
    import torch

    torch.cuda.set_device = lambda device: None


def _watch(engine: Any, done: threading.Event) -> None:
    """End this process (exit 3) when the scheduler actors' event loops end before the engine
    is shut down."""
    engine._scheduler_init_result.block_until_scheduler_exits()  # logs the actor's error
    if not done.is_set():
        print("driver: a scheduler actor's event loop ended while serving", flush=True)
        os._exit(3)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import ray

    runtime_env = {"worker_process_setup_hook": cpu_actor, **spec.get("runtime_env", {})}
    ray.init(address=spec["address"], runtime_env=runtime_env, log_to_driver=True)
    from sglang.srt.ray.engine import RayEngine
    from warcore_sglang.serving import harness

    t0 = time.monotonic()
    engine = RayEngine(**spec["engine"])
    startup = time.monotonic() - t0
    done = threading.Event()
    threading.Thread(target=_watch, args=(engine, done), daemon=True).start()
    tokens: dict[str, Any] = {}
    seconds: list[float] = []
    try:
        harness.run_waves(engine, spec["waves"], tokens, seconds)
    finally:
        done.set()
        engine.shutdown()
    result = {"tokens": tokens, "startup_s": startup, "wave_s": seconds, "pid": os.getpid()}
    Path(spec["out"]).write_text(json.dumps(result))


if __name__ == "__main__":  # sglang's spawned children import this file again
    main(sys.argv[1])
