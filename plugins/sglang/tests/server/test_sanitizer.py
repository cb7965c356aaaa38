"""The sanitizer in the real engine: at each publish point of the scheduler process it poisons
the batch's ``req_to_token`` rows, lets the forward finish, restores; tokens compared with the
same requests run unpoisoned in the same server."""

from __future__ import annotations

from _servers import Run, Servers
from warcore_sglang.audit import sanitize


def _report(run: Run) -> sanitize.Report:
    return sanitize.compare(run.records, run.plain(), run.poisoned())


def test_sglangs_own_torch_native_declarations_are_sound(servers: Servers) -> None:
    run = servers["warcore_http"]  # sglang's own torch_native answer stands there (see above)
    report = _report(run)
    assert report.compared == 12 and report.ok, report.lines()
    # torch_native declares prefill UNKNOWN: nothing publishes before the forward ends, so there
    # is no early point to poison (its forward reads req_to_token: it must declare so)
    assert not run.kind("poison") and not run.kind("publish")
    assert {b["declared"] for b in run.prefills()} == {"UNKNOWN"}


def test_the_fork_backends_early_prefill_declaration_is_a_violation(servers: Servers) -> None:
    run = servers["fork_alone"]
    report = _report(run)
    assert not report.ok
    (violation,) = report.violations
    assert violation.backend == "ForkNativeAttnBackend"
    assert violation.mode == "EXTEND" and violation.record_point == "pre_replay"
    assert violation.declared == "PRE_REPLAY"
    assert violation.provenance == "sglang:ForkNativeAttnBackend.shared_read_ends"
    assert violation.changed == {r for r in run.poisoned()}, report.lines()
    poisoned = run.kind("poison")
    assert len(poisoned) == 2 and all(p["buffers"] == ["req_to_token"] for p in poisoned)
    assert all(p["rids"] and all(r.startswith(sanitize.TAG) for r in p["rids"]) for p in poisoned)
    # ... though its plain run on this CPU gives the right tokens (torch_native's, the same
    # forward): no race can happen here
    assert run.plain() == servers["warcore_http"].plain()


def test_the_fork_backend_with_its_declaration_corrected_is_sound(servers: Servers) -> None:
    run = servers["fork_late"]
    report = _report(run)
    assert report.ok and report.compared == 12, report.lines()
    assert not run.kind("poison")
