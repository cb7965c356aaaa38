"""The sglang functions warcore's PD patches rely on, on the installed sglang's real classes (no
server): its entry's rows and structural checks of them hold, each audited release either has
a part's rows or says what it lacks, and sglang's own registration parser takes the mark and
ignores it."""

from __future__ import annotations

import importlib
import logging
from types import SimpleNamespace

import pytest
from warcore_sglang.activation import _disagg, _state
from warcore_sglang.releases import CONN, PAIRING, RELEASES, TRANSFER_ORDER

from warcore.integration.engine_code import check_functions

VERSION = "0.5.23"
RELEASE = RELEASES[VERSION]
FRAMES = _disagg.frames(RELEASE)


@pytest.mark.parametrize("module", [TRANSFER_ORDER[0], PAIRING[0]])
def test_the_rows_and_checks_are_the_installed_sglangs(module: str) -> None:
    imported = importlib.import_module(module)
    check_functions(imported, RELEASE.functions_of(module), VERSION)
    assert RELEASE.checks[module]
    for check in RELEASE.checks[module]:
        check.live(imported)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_each_release_has_a_parts_rows_or_says_what_it_lacks(version: str) -> None:
    release = RELEASES[version]
    for module, qualnames in (TRANSFER_ORDER, PAIRING):
        rows = release.functions_of(module)
        missing = [q for q in qualnames if q not in rows]
        why = _disagg._lacking(release, module, qualnames)
        if not missing:
            assert why is None
            continue
        assert why is not None and "\n" not in why
        assert f"{module}:{missing[0]}" in release.lacks, (version, missing[0])
        assert why == (
            f"sglang {version} lacks {missing[0]} ({release.lacks[f'{module}:{missing[0]}']})"
        )
    # what each audited release has (read from its wheel: docs/sglang-pd.md)
    assert _disagg._lacking(release, *TRANSFER_ORDER) is None
    assert (_disagg._lacking(release, *PAIRING) is None) == (version == "0.5.23")


def test_a_release_without_the_pairing_rows_pairs_nothing_and_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """0.5.22's entry in force, a prefill side of the Mooncake backend: nothing is patched, and
    the start-up line says why, from the entry's ``lacks``."""
    conn = importlib.import_module(CONN)
    before = dict(vars(conn.KVArgsRegisterInfo)), dict(vars(conn.MooncakeKVManager))
    release = RELEASES["0.5.22"]
    monkeypatch.setattr(_state, "current", SimpleNamespace(release=release))
    monkeypatch.setattr(_disagg._A, "release", release)
    with caplog.at_level(logging.INFO, logger="warcore.sglang"):
        _disagg.install(SimpleNamespace(disaggregation_mode="prefill"))
    assert (dict(vars(conn.KVArgsRegisterInfo)), dict(vars(conn.MooncakeKVManager))) == before
    [line] = [r for r in caplog.records if "side of a PD pair" in r.getMessage()]
    assert line.levelno == logging.WARNING and "\n" not in line.getMessage()
    assert line.getMessage().endswith(
        "is the prefill side of a PD pair: without the pairing check (Mooncake): sglang "
        "0.5.22 lacks MooncakeKVManager.build_receiver_registration_message (the decode side's "
        "registration is built inline in MooncakeKVReceiver._register_kv_args and sent there "
        "(no function returns it for warcore to mark): no pairing check, sides with and "
        "without warcore pair as sglang pairs them)"
    )


def _registration() -> list[bytes]:
    """A registration message as sglang builds it: its frames, empty where optional."""
    frames = [b"None", b"127.0.0.1", b"4321", b"127.0.0.1:5678", b"", b"", b"", b"0", b"1", b"8"]
    return frames + [b""] * (FRAMES - len(frames))


def test_sglangs_parser_reads_a_marked_registration_as_an_unmarked_one() -> None:
    conn = importlib.import_module(CONN)
    parse = vars(conn.KVArgsRegisterInfo)["from_zmq"].__func__
    plain = conn.KVArgsRegisterInfo.from_zmq(_registration())
    marked_msg = _disagg._marked(lambda _: _registration())(None)
    assert marked_msg[-1] == _disagg.MARK and len(marked_msg) == FRAMES + 1
    assert conn.KVArgsRegisterInfo.from_zmq(marked_msg) == plain  # sglang ignores the frame
    remembered = _disagg._remembered(parse, FRAMES)
    assert getattr(remembered(conn.KVArgsRegisterInfo, marked_msg), _disagg._PEER) is True
    unmarked = remembered(conn.KVArgsRegisterInfo, _registration())
    assert getattr(unmarked, _disagg._PEER) is False


def test_an_unmarked_peer_is_rejected_with_one_line_naming_it() -> None:
    conn = importlib.import_module(CONN)
    parse = _disagg._remembered(vars(conn.KVArgsRegisterInfo)["from_zmq"].__func__, FRAMES)
    verdict = _disagg._refusing(lambda _self, _info: (True, None))
    fully_checked, reason = verdict(None, parse(conn.KVArgsRegisterInfo, _registration()))
    assert not fully_checked and "\n" not in reason
    assert reason.startswith("warcore-sglang: decode peer 127.0.0.1:4321 (tp rank 0, mooncake ")
    assert "pairing refused" in reason
    marked = parse(conn.KVArgsRegisterInfo, [*_registration(), _disagg.MARK])
    assert verdict(None, marked) == (True, None)  # sglang's own verdict stands
