"""Plugins registered at run time (issue 17): from code that has no source file, and plugins
whose hooks keep changing the plugin set.

* Item 1: a plugin class or object defined in ``python -c``, a REPL or a notebook cell lives
  in ``__main__`` without a ``__file__``; ``inspect`` raises ``OSError`` for it. It registers,
  resolves, and is listed (``warcore plugins``) with no source path.
* Item 3: a hook that registers another plugin every time it is asked never lets a decision
  settle. The decision cache retries a bounded number of times, blames that plugin (one log
  line, and ``warcore check``), and uses the coarse fence; ``warcore matrix`` and ``warcore
  run`` finish.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

# -- item 1: plugins without a source file ---------------------------------------------------

NOTEBOOK_CELL = """
import json, warcore
from warcore import ForwardMode, SharedReadBoundary
from warcore.cli import main


class wctest_cell_plugin:  # registered as a class, as pluggy allows
    @warcore.hookimpl
    def warcore_shared_read_boundary(backend, forward_mode):
        if backend == "torch_native" and forward_mode is ForwardMode.DECODE:
            return SharedReadBoundary.POST_REPLAY
        return None


class CellObject:  # registered as an instance
    @warcore.hookimpl
    def warcore_fast_path_veto(self, forward_mode, context):
        return None


pm = warcore.get_plugin_manager()
# Assignments, not expression statements: a REPL would echo their values.
names = [pm.register(wctest_cell_plugin, name="wctest_cell_class")]
names.append(pm.register(CellObject(), name="wctest_cell_object"))
resolved = warcore.resolve_shared_read_boundary("torch_native", ForwardMode.DECODE)
print(json.dumps([resolved.boundary.name, resolved.source]))
status = main(["plugins", "--json"])
"""


_ENV = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")} | {
    "WARCORE_PLUGINS": ""  # the core's built-ins only
}


def _listed(stdout: str) -> tuple[list[str], dict[str, dict[str, object]]]:
    first, _, rest = stdout.partition("\n")
    return json.loads(first), {p["name"]: p for p in json.loads(rest)["plugins"]}


def test_a_plugin_defined_in_python_c_registers_resolves_and_is_listed_without_a_path() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK_CELL)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_ENV,
    )
    assert done.returncode == 0, done.stderr
    resolved, plugins = _listed(done.stdout)
    assert resolved == ["POST_REPLAY", "plugin:wctest_cell_class"]
    for name, hook in [
        ("wctest_cell_class", "warcore_shared_read_boundary"),
        ("wctest_cell_object", "warcore_fast_path_veto"),
    ]:
        info = plugins[name]
        assert (info["status"], info["path"], info["registered_by"]) == ("active", None, "runtime")
        assert info["hooks"] == [hook]
    # A plugin with a file still gets its path.
    assert str(plugins["warcore"]["path"]).endswith("_builtins.py")


def test_a_plugin_typed_into_a_repl_registers_and_is_listed_without_a_path() -> None:
    # The interactive interpreter reads from a pipe here (-i): __main__ has no __file__.
    done = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=textwrap.dedent(NOTEBOOK_CELL) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=_ENV,
    )
    assert "Traceback" not in done.stderr, done.stderr
    resolved, plugins = _listed(done.stdout)
    assert resolved == ["POST_REPLAY", "plugin:wctest_cell_class"]
    assert plugins["wctest_cell_object"]["path"] is None
