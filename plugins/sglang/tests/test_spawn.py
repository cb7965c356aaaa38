"""The activation reaches a child started with ``multiprocessing`` ``spawn``, the way sglang
starts its scheduler: the child inherits ``WARCORE_SGLANG=1``, runs sglang's real
``load_plugins()`` (which runs warcore-sglang's ``sglang.srt.plugins`` entry point), and there
sglang's declaration points answer through warcore, including for modules imported only after
the activation (patched by its post-import hook)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from _spawn_child import WATCHED, child

# the spawn mechanism; an older release's own processes are its real Engine's (tests/release)
pytestmark = pytest.mark.any_release


def _spawn(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "child.json"
    process = multiprocessing.get_context("spawn").Process(target=child, args=(str(out),))
    process.start()
    process.join(timeout=600)
    assert process.exitcode == 0, process.exitcode
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_warcore_sglang_1_activates_in_a_spawned_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARCORE_SGLANG", "1")
    result = _spawn(tmp_path)
    assert result["env"] == "1"
    assert result["installed"] is True
    # Installed before sglang's backend and runner modules were imported: the hook patched them.
    assert not set(WATCHED) & set(result["imported_before"]), result["imported_before"]
    assert result["runner_patched"] and result["backend_patched"]
    assert result["before"] == "IN_REPLAY"
    assert result["after"] == "POST_REPLAY"  # a plugin registered in the child moved it
    assert result["gate_eagle"] is False
    assert result["ends_type_ok"]


def test_without_the_variable_the_child_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WARCORE_SGLANG", raising=False)
    result = _spawn(tmp_path)
    assert result["installed"] is False
