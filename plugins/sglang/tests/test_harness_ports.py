"""The test harness's ports: picked below the kernel's ephemeral range, where no other
process's ``connect()`` or ``bind(0)`` can take one before the server started later binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from warcore_sglang.serving import harness

pytestmark = pytest.mark.any_release  # the harness's own working, on whichever release

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.is_file(), reason="no Linux ephemeral port range here")
def test_a_free_port_is_below_the_ephemeral_range_and_sglangs_own_and_binds() -> None:
    ephemeral_from = int(RANGE.read_text().split()[0])
    ports = {harness.free_port() for _ in range(20)}
    assert all(10000 <= port < min(ephemeral_from, 22000) for port in ports), sorted(ports)
    assert len(ports) > 1  # at random: two servers started at once do not share one
    for port in ports:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()


def test_a_port_taken_meanwhile_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken, socket.socket() as other:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        other.bind(("127.0.0.1", 0))
        candidates = [taken.getsockname()[1], other.getsockname()[1]]
        other.close()  # free again: the one to hand out
        monkeypatch.setattr(harness.random, "sample", lambda *_: candidates)
        assert harness.free_port() == candidates[1]
