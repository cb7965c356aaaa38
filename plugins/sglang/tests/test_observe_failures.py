"""A diagnostic never takes an sglang process down: a trace file that cannot be written is named
at start-up and the trace stays off; a listener that fails mid-run is switched off."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from warcore_sglang import _entry, _observe


def test_an_unwritable_trace_file_is_named_at_start_up_and_the_trace_stays_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARCORE_SGLANG_TRACE", str(tmp_path / "no-such-folder" / "trace.jsonl"))
    monkeypatch.delenv("WARCORE_SGLANG_SANITIZE", raising=False)
    status = _entry.Status(1, "scheduler", {}, False, None, logging.INFO)
    _entry._observe(status)
    assert status.trace is None
    assert status.level == logging.ERROR
    assert any(
        "trace/sanitizer not installed" in p and "no-such-folder" in p for p in status.problems
    ), status.problems


def test_a_listener_that_fails_is_switched_off_and_named(caplog: pytest.LogCaptureFixture) -> None:
    class FullDisk:
        def barrier(self, *args: object) -> None:
            raise OSError("no space left on device")

    listener = FullDisk()
    _observe._listeners.append(listener)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.ERROR, logger="warcore_sglang"):
            _observe._each("barrier", object())
            _observe._each("barrier", object())  # switched off: not called, not logged again
    finally:
        if listener in _observe._listeners:
            _observe._listeners.remove(listener)  # type: ignore[arg-type]
    failures = [r for r in caplog.records if "switched off" in r.getMessage()]
    assert len(failures) == 1 and "no space left on device" in caplog.text
