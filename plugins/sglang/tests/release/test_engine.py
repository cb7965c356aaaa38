"""warcore active in the installed sglang release's real ``Engine``, and sglang's own tokens.

The scheduler says one start-up line naming the release in force; every barrier of the run
with ``WARCORE_SGLANG=1`` was answered with warcore active, none of the run without; the two
runs returned the same tokens for the same requests (greedy decoding: warcore changes where a
barrier waits, never what a forward computes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _engines import WAVES, Engines, Served
from _release import RELEASE, VERSION


def _scheduler(served: Served) -> dict[str, Any]:
    processes = [p for p in served.kind("process") if p["role"] == "scheduler"]
    assert len(processes) == 1, processes
    return processes[0]


def test_the_scheduler_says_active_once_naming_the_release(engines: Engines) -> None:
    scheduler = _scheduler(engines.warcore)
    line = str(scheduler["line"])
    assert scheduler["active"] is True, line
    assert f"warcore active on sglang {VERSION} in " in line, line
    plugins = line.split("; plugins: ", 1)[1].split(";", 1)[0]
    assert any(p.startswith("sglang (warcore-sglang ") for p in plugins.split(", ")), line
    log = Path(engines.warcore.log).read_text(errors="replace")
    said = [ln for ln in log.splitlines() if f"warcore-sglang: process {scheduler['pid']} (" in ln]
    assert len(said) == 1 and line in said[0], said
    # the processes that say a line are the ones this release's sglang loads plugins in
    roles = {str(p["role"]) for p in engines.warcore.kind("process")}
    assert roles == {"engine", "scheduler", "detokenizer"} & RELEASE.plugin_processes, roles


def test_warcore_answered_every_barrier_and_sglang_alone_none(engines: Engines) -> None:
    ours, alone = engines.warcore.kind("barrier"), engines.alone.kind("barrier")
    assert ours and alone
    assert all(b["warcore"] for b in ours), ours
    assert not any(b["warcore"] for b in alone), alone
    assert {b["mode"] for b in ours} >= {"EXTEND", "DECODE"}


def test_the_tokens_are_sglangs_own(engines: Engines) -> None:
    asked = {r.rid: r.max_new_tokens for wave in WAVES for r in wave}
    assert {rid: len(ids) for rid, ids in engines.alone.tokens.items()} == asked
    assert engines.warcore.tokens == engines.alone.tokens
