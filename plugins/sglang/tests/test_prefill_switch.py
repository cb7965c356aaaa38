"""``WARCORE_SGLANG_PREFILL_SWITCH``: which sglang switch decides the prefill fast path.

Asked of the installed release's real ``TRTLLMHAAttnBackend`` (EXTEND ``PRE_REPLAY``) through
its patched prefill decision point (0.5.23's ``resolve_prefill_shared_read_ends``, 0.5.21's and
0.5.22's publisher), with the variables set in the real environment and read by sglang's real
``envs``. The opt-in's default is the release's (0.5.23: on; 0.5.21, 0.5.22: off).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import warcore_sglang
from _real import A, algorithm, cls, leaf, prefill
from _release import RELEASE
from warcore_sglang import _entry
from warcore_sglang.audit import sanitize, trace
from warcore_sglang.settings import (
    ENV_PREFILL_SWITCH,
    OPT_IN,
    OPT_OUT,
    PrefillSwitchError,
    fast_path_env,
)

# (setting, the variables set, whether the prefill may publish early, the switch provenance when
# it may not)
CASES = [
    (None, {}, True, None),  # the opt-in's default (0.5.23: EnvBool(True))
    (None, {OPT_IN: "0"}, False, f"sglang:{OPT_IN} is off"),
    ("own", {OPT_IN: "1"}, True, None),
    ("own", {OPT_IN: "false"}, False, f"sglang:{OPT_IN} is off"),
    ("own", {OPT_OUT: "1"}, True, None),  # no audited release reads the opt-out
    ("main", {}, True, None),
    ("main", {OPT_OUT: "1"}, False, f"sglang:{OPT_OUT} is on"),
    (" Main ", {OPT_OUT: "YES"}, False, f"sglang:{OPT_OUT} is on"),
    ("main", {OPT_OUT: "0"}, True, None),
    ("main", {OPT_OUT: "n"}, True, None),
    ("main", {OPT_IN: "0"}, False, f"sglang:{OPT_IN} is off"),  # sglang's own switch stands
    ("main", {OPT_OUT: "maybe"}, False, f"sglang:{OPT_OUT} is on"),  # unreadable: coarse
]


@pytest.fixture
def wctest_clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in (ENV_PREFILL_SWITCH, OPT_IN, OPT_OUT, "SGLANG_FORCE_COARSE_WAR_BARRIER"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def _set(mp: pytest.MonkeyPatch, setting: str | None, env: dict[str, str]) -> None:
    if setting is not None:
        mp.setenv(ENV_PREFILL_SWITCH, setting)
    for name, value in env.items():
        mp.setenv(name, value)


def _with_the_default(env: dict[str, str], on: bool, why: str | None) -> tuple[bool, str | None]:
    """A case that leaves the opt-in unset: under a release whose opt-in is off by default,
    the opt-in closes it (and says so first)."""
    if OPT_IN in env or RELEASE.prefill_switch_default:
        return on, why
    return False, f"sglang:{OPT_IN} is off"


@pytest.mark.parametrize(("setting", "env", "on", "why"), CASES)
def test_prefill_switch_setting_and_variable_decide_the_prefill(
    pm: Any,
    wctest_clean_env: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: str | None,
    env: dict[str, str],
    on: bool,
    why: str | None,
) -> None:
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    on, why = _with_the_default(env, on, why)
    _set(wctest_clean_env, setting, env)
    trt = leaf("trtllm_mha", algorithm("none"))
    want = SharedReadEnds.PRE_REPLAY if on else SharedReadEnds.UNKNOWN
    with caplog.at_level(logging.WARNING):
        warcore_sglang.install()  # the warnings come at start-up, before any prefill
    warned = [r.getMessage() for r in caplog.records if "warcore-sglang: SGLANG_" in r.getMessage()]
    try:
        for snapshot in (False, True):
            assert prefill(trt, snapshot=snapshot) is want, snapshot
        boundary, provenance = trace.explain(SimpleNamespace(attn_backend=trt), ForwardMode.EXTEND)
    finally:
        warcore_sglang.uninstall()
    assert boundary == want.name
    if why is not None:
        assert provenance == why
    else:  # the switch let it through: the declaration decided
        assert "PREFILL" not in provenance, provenance
    if env.get(OPT_OUT) == "maybe":
        assert any(f"{OPT_OUT}='maybe' is not a boolean" in m for m in warned), warned
    else:
        assert not warned


def test_prefill_switch_without_the_activation_is_sglangs_own(
    wctest_clean_env: pytest.MonkeyPatch,
) -> None:
    """Not activated, the release's own prefill decision runs whatever the setting: the trace
    says what that code does."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    _set(wctest_clean_env, "main", {OPT_OUT: "1", OPT_IN: "1"})
    assert not warcore_sglang.is_installed()
    trt = leaf("trtllm_mha", algorithm("none"))
    runner = SimpleNamespace(attn_backend=trt, spec_algorithm=algorithm("none"))
    assert prefill(trt) is SharedReadEnds.PRE_REPLAY
    assert trace.explain(runner, ForwardMode.EXTEND)[0] == "PRE_REPLAY"
    wctest_clean_env.setenv(OPT_IN, "0")
    assert prefill(trt) is SharedReadEnds.UNKNOWN
    assert trace.explain(runner, ForwardMode.EXTEND) == ("UNKNOWN", f"sglang:{OPT_IN} is off")


def test_prefill_switch_a_bad_value_is_refused_at_install(
    pm: Any, wctest_clean_env: pytest.MonkeyPatch
) -> None:
    base = cls(A + "base_attn_backend.AttentionBackend")
    original = vars(base)["shared_read_ends"]
    wctest_clean_env.setenv(ENV_PREFILL_SWITCH, "0.6")
    with pytest.raises(PrefillSwitchError) as info:
        warcore_sglang.install()
    message = str(info.value)
    assert f"{ENV_PREFILL_SWITCH}='0.6'" in message
    assert "'own'" in message and "'main'" in message, message
    assert not warcore_sglang.is_installed()
    assert vars(base)["shared_read_ends"] is original  # nothing patched
    # in a server process: not active, and the start-up line says why
    wctest_clean_env.setenv(warcore_sglang.ENV_ACTIVATE, "1")
    status = _entry.sglang_plugin()
    assert status is not None and not status.active
    assert status.reason is not None and f"{ENV_PREFILL_SWITCH}='0.6'" in status.reason
    assert not warcore_sglang.is_installed()
    # the sanitizer refuses it before starting a server
    with pytest.raises(SystemExit) as exit_info:
        sanitize.main(["--cpu-tiny-model", "/nonexistent"])
    assert exit_info.value.code == 2


def test_prefill_switch_the_sanitizer_turns_the_fast_path_on() -> None:
    assert fast_path_env({}) == {OPT_IN: "1"}
    assert fast_path_env({OPT_IN: "0"}) == {OPT_IN: "0"}  # the caller's stands


def test_prefill_switch_is_read_per_call_after_install(
    pm: Any, wctest_clean_env: pytest.MonkeyPatch
) -> None:
    """The variables are read per call, as sglang reads them; the setting once, at install.
    Under ``main`` the installed sglang's own switch still applies: either one closes."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    wctest_clean_env.setenv(ENV_PREFILL_SWITCH, "main")
    wctest_clean_env.setenv(OPT_IN, "1")
    trt = leaf("trtllm_mha", algorithm("none"))

    def ask() -> Any:
        return prefill(trt)

    warcore_sglang.install()
    try:
        wctest_clean_env.setenv(ENV_PREFILL_SWITCH, "own")  # too late: main stays
        assert ask() is SharedReadEnds.PRE_REPLAY
        wctest_clean_env.setenv(OPT_OUT, "1")
        assert ask() is SharedReadEnds.UNKNOWN
        wctest_clean_env.setenv(OPT_OUT, "0")
        assert ask() is SharedReadEnds.PRE_REPLAY
        wctest_clean_env.setenv(OPT_IN, "no")  # sglang's own switch, read by its own code
        assert ask() is SharedReadEnds.UNKNOWN
    finally:
        warcore_sglang.uninstall()
