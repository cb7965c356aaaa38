"""The sglang functions warcore's PD patches rely on, on the installed sglang's real classes (no
server): their rows match, and sglang's own registration parser takes the mark and ignores it."""

from __future__ import annotations

import importlib

import pytest
from warcore_sglang.activation import _disagg

from warcore.integration.engine_code import check_functions

ROWS = _disagg.FUNCTIONS["0.5.23"]


@pytest.mark.parametrize("module", sorted(ROWS))
def test_the_rows_are_the_installed_sglangs(module: str) -> None:
    check_functions(importlib.import_module(module), ROWS[module], "0.5.23")


def _registration() -> list[bytes]:
    """A registration message as sglang 0.5.23 builds it: its 20 frames, empty where optional."""
    frames = [b"None", b"127.0.0.1", b"4321", b"127.0.0.1:5678", b"", b"", b"", b"0", b"1", b"8"]
    return frames + [b""] * (_disagg.FRAMES - len(frames))


def test_sglangs_parser_reads_a_marked_registration_as_an_unmarked_one() -> None:
    conn = importlib.import_module(_disagg.CONN)
    parse = vars(conn.KVArgsRegisterInfo)["from_zmq"].__func__
    plain = conn.KVArgsRegisterInfo.from_zmq(_registration())
    marked_msg = _disagg._marked(lambda _: _registration())(None)
    assert marked_msg[-1] == _disagg.MARK and len(marked_msg) == _disagg.FRAMES + 1
    assert conn.KVArgsRegisterInfo.from_zmq(marked_msg) == plain  # sglang ignores the frame
    remembered = _disagg._remembered(parse)
    assert getattr(remembered(conn.KVArgsRegisterInfo, marked_msg), _disagg._PEER) is True
    unmarked = remembered(conn.KVArgsRegisterInfo, _registration())
    assert getattr(unmarked, _disagg._PEER) is False


def test_an_unmarked_peer_is_rejected_with_one_line_naming_it() -> None:
    conn = importlib.import_module(_disagg.CONN)
    parse = _disagg._remembered(vars(conn.KVArgsRegisterInfo)["from_zmq"].__func__)
    verdict = _disagg._refusing(lambda _self, _info: (True, None))
    fully_checked, reason = verdict(None, parse(conn.KVArgsRegisterInfo, _registration()))
    assert not fully_checked and "\n" not in reason
    assert reason.startswith("warcore-sglang: decode peer 127.0.0.1:4321 (tp rank 0, mooncake ")
    assert "pairing refused" in reason
    marked = parse(conn.KVArgsRegisterInfo, [*_registration(), _disagg.MARK])
    assert verdict(None, marked) == (True, None)  # sglang's own verdict stands
