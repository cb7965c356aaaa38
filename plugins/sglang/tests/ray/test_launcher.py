"""``python -m sglang.launch_server --use-ray`` loads plugins at module level and imports its
Ray launcher (``sglang.srt.ray.http_server``, which imports ``RayEngine`` and the actor) only
later: the entry point wraps the actors' constructor when the actor module is imported.

Real sglang and Ray modules in a child process (the entry point changes the process's import
machinery); no cluster is started."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _rays import cluster_env

_CHILD = r"""
import json, sys
from warcore_sglang import _entry

def load_plugins():  # as sglang/launch_server.py calls it, at module level
    return _entry.sglang_plugin()

def launch_server():
    return load_plugins()

launch_server()
before = "sglang.srt.ray.scheduler_actor" in sys.modules
from sglang.srt.ray.http_server import launch_server as ray_launch_server
from sglang.srt.ray.scheduler_actor import SchedulerActor

init = SchedulerActor.__ray_metadata__.modified_class.__init__
print("FOUND " + json.dumps({
    "before": before,
    "wrapped": getattr(init, "__warcore_sglang_actor__", False),
    "original": getattr(init, "__warcore_original__", init).__qualname__,
}))
"""


def test_a_launcher_wraps_the_actor_when_it_imports_it_later() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_SGLANG")}
    env |= {**cluster_env(), "WARCORE_SGLANG": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("FOUND ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    found = json.loads(lines[-1][6:])
    assert found == {
        "before": False,
        "wrapped": True,
        "original": "SchedulerActor.__init__",
    }, found
