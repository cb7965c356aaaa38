"""An older audited sglang release in its real ``Engine`` (``nox -s "sglang_release(...)"``; the
newest release's engines are ``tests/server``'s). Both engines, one with ``WARCORE_SGLANG=1``
and one with sglang alone, start in the background as the session begins and are awaited by
the tests that assert on them."""

from __future__ import annotations

import concurrent.futures
import importlib.util
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without sglang (the core's venvs)
else:
    from _engines import TIMEOUT, Engines, serve_both

    @pytest.fixture(scope="session", autouse=True)
    def _engines(
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[concurrent.futures.Future[Engines]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            yield pool.submit(serve_both, tmp_path_factory.mktemp("engines"))

    @pytest.fixture(scope="session")
    def engines(_engines: concurrent.futures.Future[Engines]) -> Engines:
        return _engines.result(timeout=2 * TIMEOUT + 60)
