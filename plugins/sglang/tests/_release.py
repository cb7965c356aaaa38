"""The sglang release this environment installs, as the tests see it: its audited entry, and
ways to change that entry for one test (an sglang whose drift the gate does not see; a watched
module that moved)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from warcore_sglang.activation import _state
from warcore_sglang.declarations import oracle
from warcore_sglang.releases import RELEASES, SglangRelease

VERSION = oracle.installed_version() or ""
RELEASE: SglangRelease = RELEASES[VERSION]
"""The installed release's entry (every test environment installs an audited release)."""

RESOLVER = RELEASE.prefill == "resolver"
"""0.5.23's shape: ``resolve_prefill_shared_read_ends`` decides a prefill per batch."""

resolver_only = pytest.mark.skipif(
    not RESOLVER, reason=f"sglang {VERSION} has no prefill resolver (its publisher decides)"
)
publisher_only = pytest.mark.skipif(
    RESOLVER, reason=f"sglang {VERSION} decides a prefill in its resolver, not its publisher"
)


def replace_release(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> SglangRelease:
    """The installed release's entry with ``changes``, for this test (install reads it)."""
    changed = dataclasses.replace(RELEASE, **changes)
    monkeypatch.setitem(RELEASES, VERSION, changed)
    return changed


def open_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """An sglang whose drift the gate does not see: every check passes whatever the code."""
    monkeypatch.setattr(_state.activation, "check_module", lambda module: None)
    monkeypatch.setattr(_state.activation, "check_class", lambda cls: None)
