"""``harness.stop_tree`` on real processes: what it reports of the process it stops is what that
process did. A psutil wait on a child of the test process reaps it, and its ``Popen`` then
answers ``ECHILD`` with 0: a launcher that a failure ended read as one that exited cleanly
(the two-node test saw a refused node 0 "exit 0" that way)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest
from warcore_sglang.serving import harness

pytestmark = pytest.mark.any_release  # the harness's own working, on whichever release

PARENT_OF_A_SLEEPER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
{then}
"""


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _zombie(child: subprocess.Popen[bytes]) -> None:
    """Until ``child`` has exited and waits, unreaped, for its parent (this process)."""
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child did not exit in 30 s"
        time.sleep(0.05)


def test_a_child_that_exited_by_itself_keeps_its_exit_status() -> None:
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    _zombie(child)  # exited, not yet polled: what the nodes' finally found
    assert harness.stop_tree(child, grace=5) == []
    assert child.returncode == 3


def test_a_child_killed_by_a_signal_keeps_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    _zombie(child)
    harness.stop_tree(child, grace=5)
    assert child.returncode == -signal.SIGKILL


def test_a_running_tree_is_stopped_and_the_root_reports_the_signal() -> None:
    script = PARENT_OF_A_SLEEPER.format(then="time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    grandchild = int(child.stdout.readline())
    alive = harness.stop_tree(child, grace=10)
    assert sorted(alive) == sorted([child.pid, grandchild])
    assert child.returncode == -signal.SIGTERM
    assert _ended(grandchild)


def test_a_root_ignoring_sigterm_is_killed_after_the_grace() -> None:
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(0, flush=True)"
    script = PARENT_OF_A_SLEEPER.format(then=f"{ignore}\ntime.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    int(child.stdout.readline())
    child.stdout.readline()  # SIGTERM is ignored from here on
    started = time.monotonic()
    harness.stop_tree(child, grace=1)
    assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_an_orphan_named_in_known_is_stopped_too() -> None:
    script = PARENT_OF_A_SLEEPER.format(then="")  # the parent exits, its sleeper lives on
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    orphan = int(child.stdout.readline())
    child.wait(timeout=30)
    assert psutil.Process(orphan).is_running()
    assert harness.stop_tree(child, grace=10, known=[orphan]) == [orphan]
    assert child.returncode == 0
    deadline = time.monotonic() + 10
    while not _ended(orphan):
        assert time.monotonic() < deadline, "the orphan is still running"
        time.sleep(0.05)


def test_a_pid_instead_of_the_popen_is_refused_naming_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(TypeError, match=rf"not int {child.pid} \(its exit status"):
            harness.stop_tree(child.pid)  # type: ignore[arg-type]
        assert child.poll() is None  # refused before touching anything
    finally:
        harness.stop_tree(child, grace=5)
    assert child.returncode == -signal.SIGTERM
