"""warcore inside sglang: sglang's own declarations as a warcore plugin, and an activation that
makes sglang's declaration points answer through warcore, never earlier than sglang itself.

One installation serves every audited sglang release (0.5.21, 0.5.22, 0.5.23: their facts are
data, :mod:`warcore_sglang.releases`); any other is refused in one line and serves on sglang's
own decisions. The package, by concern:

* :mod:`warcore_sglang.releases`: each audited release's facts (relied-on functions, watched
  modules and their steps, structural checks, what the declarations need that differs);
* :mod:`warcore_sglang.declarations`: how sglang's names meet warcore's
  (:mod:`~warcore_sglang.declarations.names`), sglang's real classes asked on bare objects
  (:mod:`~warcore_sglang.declarations.oracle`), and the warcore plugin ``sglang``
  (:mod:`~warcore_sglang.declarations.plugin`, entry point ``warcore``);
* :mod:`warcore_sglang.activation`: :func:`install` / :func:`uninstall`, the patched points,
  the rank check; ``WARCORE_SGLANG=1`` does it in every server process that builds a model
  runner, through sglang's ``sglang.srt.plugins`` entry point (:mod:`warcore_sglang._entry`);
  :mod:`warcore_sglang.settings` reads its other variables;
* :mod:`warcore_sglang.audit`: inside a running server, the trace, the ranks compared batch by
  batch, and the sanitizer;
* :mod:`warcore_sglang.serving`: a real sglang ``Engine`` or HTTP server on this machine
  (``python -m warcore_sglang.serving.launch_server``), the test harness that starts them, and
  the benchmarks (``python -m warcore_sglang.serving.bench``, ``.bench_server``).

Importing this package imports neither sglang, torch nor warcore (standard library only: the
entry point names a shadowed ``warcore`` package before importing it).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["ENV_ACTIVATE", "install", "is_installed", "shadowed", "uninstall"]

__version__ = "0.1.0"

ENV_ACTIVATE = "WARCORE_SGLANG"
"""``1``: sglang's plugin loader activates warcore in every server process that may build a
model runner (each scheduler child; not the launcher, the detokenizer or the DP controller)."""


def install(**kwargs: Any) -> None:
    """Make sglang's declaration points answer through warcore in this process (idempotent).
    See :func:`warcore_sglang.activation.install`."""
    from .activation import install as _install

    _install(**kwargs)


def uninstall() -> None:
    """Restore every attribute :func:`install` patched, exactly (idempotent)."""
    from .activation import uninstall as _uninstall

    _uninstall()


def is_installed() -> bool:
    from .activation import is_installed as _is_installed

    return _is_installed()


def shadowed(name: str = "warcore") -> str | None:
    """Where ``import name`` would find a namespace package (a folder without
    ``__init__.py``) instead of the installed package; ``None`` when it does not."""
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin not in (None, "namespace"):
        return None
    locations = list(spec.submodule_search_locations or [])
    return ", ".join(locations) or "(unknown location)"
