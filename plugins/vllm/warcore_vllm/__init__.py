"""warcore inside vLLM 0.33.0: vLLM's overlapped input staging declared in warcore's
vocabulary, audited on vLLM's real classes, and an activation that keeps an unguarded overlap
coarse.

* :mod:`warcore_vllm._names`: what is declared (each runner's staging: guard, depth, release,
  host reads; the scheduler's deferred free) and the vLLM functions it relies on, with their
  audited signatures and digests. Pure data.
* ``python -m warcore_vllm.audit`` (:mod:`warcore_vllm.audit`): one verdict per check and
  configuration, from vLLM's real classes on a CPU.
* :func:`install` / :func:`uninstall` (:mod:`warcore_vllm.activation`: the runner is checked
  and patched where vLLM imports it); ``WARCORE_VLLM=1`` does it in every vLLM process through
  vLLM's ``vllm.general_plugins`` entry point, with one start-up line per process.
* ``python -m warcore_vllm.bench``: what warcore-vllm costs a vLLM process at start-up.

Importing this package imports neither vLLM nor torch.
"""

from __future__ import annotations

from ._entry import ENV_ACTIVATE
from ._names import SUPPORTED

__all__ = ["ENV_ACTIVATE", "SUPPORTED", "install", "is_installed", "uninstall"]

__version__ = "0.1.0"


def install() -> None:
    from .activation import install as _install

    _install()


def uninstall() -> None:
    from .activation import uninstall as _uninstall

    _uninstall()


def is_installed() -> bool:
    from .activation import is_installed as _is_installed

    return _is_installed()
