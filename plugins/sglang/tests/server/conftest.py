"""Fixtures: the real servers of ``_servers.py``, started once per session and shared."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _servers import Servers


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    started = Servers(tmp_path_factory.mktemp("servers"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture(scope="session")
def model(servers: Servers) -> Path:
    return servers.model
