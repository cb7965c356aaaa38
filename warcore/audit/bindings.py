"""The binding audit: does every wait on a read-done event bind to the record it means?

A record binds when the host issues it; a wait binds to the record issued last when the host
issues the wait. The engine notes, for each wait (:class:`~warcore.device.WaitBinding`), the
forward that published the event (the one the wait *means*) and the record it *bound to*, each
record carrying the forward that issued it. Bound to:

* the forward it meant: sound;
* an **earlier** forward's record: a *violation*. The wait may complete before the forward it
  means has finished reading, so the scheduler may overwrite what that forward still reads;
* a **later** forward's record: a *liveness hazard* (a warning). The wait also waits for a
  forward launched after the one it means; where that forward waits in turn on the consumer
  (an all-to-all across ranks) nothing moves: sglang #31072's deadlock.

Binding is decided on the host, so the audit is deterministic: no timing, no race window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from warcore.device import ForwardId, WaitBinding

__all__ = [
    "BindingFinding",
    "BindingKind",
    "audit_bindings",
    "binding_summary",
    "describe_binding",
]

BindingKind = Literal["early-binding", "late-binding"]


@dataclass(frozen=True)
class BindingFinding:
    """A wait bound to another forward's record (the first such wait of its consumer)."""

    kind: BindingKind
    consumer: str
    meant: ForwardId
    bound: ForwardId
    count: int = 1
    """How many waits of this consumer bound the same way in the run."""

    @property
    def violation(self) -> bool:
        return self.kind == "early-binding"

    def describe(self) -> str:
        head = "VIOLATION (early-binding)" if self.violation else "WARNING (late-binding)"
        why = (
            "an earlier forward's record: it may complete before the forward it fences is "
            "done reading (unsafe)"
            if self.violation
            else "a later forward's record: it also waits for a forward launched after the one "
            "it fences, a liveness hazard (the shape that deadlocked sglang #31072)"
        )
        more = f"; {self.count} such waits" if self.count > 1 else ""
        return (
            f"{head}: the {self.consumer} wait meant {self.meant.describe()} but bound to the "
            f"record of {self.bound.describe()}, {why}{more}"
        )


def audit_bindings(bindings: Iterable[WaitBinding]) -> list[BindingFinding]:
    """Per consumer and kind, the first wait bound to another forward's record (with the
    number of such waits); violations first."""
    first: dict[tuple[str, str], BindingFinding] = {}
    counts: Counter[tuple[str, str]] = Counter()
    for b in bindings:
        verdict = b.verdict
        if verdict not in ("earlier", "later"):
            continue
        assert b.meant is not None and b.bound is not None and b.bound.forward is not None
        kind: BindingKind = "early-binding" if verdict == "earlier" else "late-binding"
        key = (b.consumer, kind)
        counts[key] += 1
        if key not in first:
            first[key] = BindingFinding(kind, b.consumer, b.meant, b.bound.forward)
    found = [
        BindingFinding(f.kind, f.consumer, f.meant, f.bound, counts[k]) for k, f in first.items()
    ]
    return sorted(found, key=lambda f: (not f.violation, f.consumer))


def binding_summary(bindings: Iterable[WaitBinding]) -> str:
    """``barrier 41 bound, copy 40 later``: each consumer's waits by verdict."""
    by: Counter[tuple[str, str]] = Counter((b.consumer, b.verdict) for b in bindings)
    return ", ".join(f"{c} {n} {v}" for (c, v), n in sorted(by.items())) or "no waits"


def describe_binding(b: WaitBinding) -> str:
    """``barrier meant step 4 target DECODE (forward #4) -> gen 2 of step 4 ...: bound``."""
    meant = b.meant.describe() if b.meant is not None else "no forward"
    if b.bound is None:
        got = "no record (never recorded)"
    else:
        who = b.bound.forward.describe() if b.bound.forward is not None else "no forward"
        got = f"record gen {b.bound.generation} of {who}"
    return f"{b.consumer} meant {meant} -> {got}: {b.verdict}"
