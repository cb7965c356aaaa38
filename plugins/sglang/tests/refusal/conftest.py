"""sglang 0.5.20, which warcore-sglang has not audited (``nox -s sglang_refusal``; the other
sglang sessions leave this folder out).

The real ``Engine`` (``_served.py``) starts in the background as the session begins (its
processes import sglang while the tests of the real classes import it here: two cores, two
imports at once) and is awaited by the test that asserts on it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import importlib.util
from collections.abc import Iterator

import pytest

installed = importlib.metadata.version("sglang") if importlib.util.find_spec("sglang") else None
if installed is None:
    collect_ignore_glob = ["test_*.py"]  # nothing to test without sglang (the core's venvs)
else:
    from _served import REFUSED, TIMEOUT, Served, serve

    if installed != REFUSED:  # a wrong environment must fail, never pass vacuously
        raise pytest.UsageError(
            f"the refusal tests need sglang {REFUSED} (installed: {installed}): run them with "
            "nox -s sglang_refusal"
        )

    @pytest.fixture(scope="session", autouse=True)
    def _engine(
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Iterator[concurrent.futures.Future[Served]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            yield pool.submit(serve, tmp_path_factory.mktemp("engine"))

    @pytest.fixture(scope="session")
    def served(_engine: concurrent.futures.Future[Served]) -> Served:
        return _engine.result(timeout=TIMEOUT + 60)
