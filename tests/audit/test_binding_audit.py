"""The binding audit as users meet it: ``warcore sanitize``, its report, and
``warcore.testing.assert_declarations_sound`` (issue 20)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _support.audit import TINY_MODEL

from warcore.audit.sanitizer import sanitize
from warcore.testing import BindingWarning, assert_declarations_sound

# whatever is installed, these check the built-ins and wctest_ fixtures: main job only
pytestmark = pytest.mark.plugin_agnostic


def test_sanitize_reports_every_barrier_bound_and_no_finding() -> None:
    report = sanitize("torch_native", "none", model=TINY_MODEL, requests=6)
    assert report.sound and report.binding_findings == []
    assert report.bindings.startswith("barrier ") and report.bindings.endswith(" bound")
    assert "bindings (overlap loop): barrier" in report.format()


def test_sanitize_warns_about_the_31072_consumer_naming_both_forwards() -> None:
    report = sanitize(
        "torch_native", "none", model=TINY_MODEL, requests=6, copy_wait="after-next-launch"
    )
    assert report.sound  # a liveness hazard, not a WAR violation
    [warning] = report.binding_warnings
    assert warning.consumer == "copy" and warning.bound.step == warning.meant.step + 1
    assert "late-binding WARNING" in report.verdict
    text = report.format()
    assert f"meant step {warning.meant.step} target DECODE" in text
    assert f"record of step {warning.bound.step} target DECODE" in text


def test_the_testing_kit_warns_with_both_forwards_and_passes() -> None:
    with pytest.warns(BindingWarning, match=r"meant step \d+ target DECODE .* step \d+ target"):
        reports = assert_declarations_sound(
            "torch_native",
            "none",
            model=TINY_MODEL,
            requests=6,
            copy_wait="after-next-launch",
        )
    assert reports[0].binding_warnings


def test_warcore_sanitize_prints_the_late_binding_and_exits_zero() -> None:
    cmd = [sys.executable, "-m", "warcore", "sanitize", "--backend", "torch_native"]
    cmd += ["--algorithm", "none", "--requests", "4", "--copy-wait", "after-next-launch"]
    cmd += ["--explain"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING (late-binding): the copy wait meant step" in done.stdout
    assert "sound with a late-binding WARNING" in done.stdout
    # --explain: per wait, the forward it meant and the record it got
    assert "torch_native / none: waits of the overlap run (binding audit)" in done.stdout
    lines = [
        ln.strip() for ln in done.stdout.splitlines() if ln.strip().startswith("barrier meant")
    ]
    assert lines and all(ln.endswith(": bound") for ln in lines)
    assert any(
        ln.strip().startswith("copy meant") and ln.endswith(": later")
        for ln in done.stdout.splitlines()
    )
