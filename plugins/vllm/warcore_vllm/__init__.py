"""warcore inside vLLM: the overlapped input staging of every vLLM release warcore-vllm audited
(:data:`warcore_vllm.releases.RELEASES`, one installation for all of them) declared in warcore's
vocabulary, audited on vLLM's real classes, and an activation that keeps what vLLM leaves
unguarded on a wait.

The package, by concern (each imports only those below it, checked by the import contract
``vllm-layers`` in pyproject.toml):

* :mod:`warcore_vllm._entry`: vLLM's ``vllm.general_plugins`` entry point; ``WARCORE_VLLM=1``
  activates warcore in every vLLM process, with one start-up line per process naming the
  release in force. ``python -m warcore_vllm.bench``: what warcore-vllm costs a vLLM process at
  start-up;
* :mod:`warcore_vllm.audit`: ``python -m warcore_vllm.audit``, one verdict per check and
  configuration, from vLLM's real classes on a CPU, in this process (``--activated``: with the
  activation installed);
* :mod:`warcore_vllm.activation`: :func:`install` / :func:`uninstall`, each watched module
  checked and patched where vLLM imports it;
* :mod:`warcore_vllm.gate`: the installed vLLM, admitted only if it is exactly an audited
  release, and its code checked against that release's entry;
* :mod:`warcore_vllm.releases`: each audited release, as data: the vLLM functions relied on
  (signatures and digests), the watched modules and their steps, the audit's checks and the
  violations vLLM leaves. Pure data;
* :mod:`warcore_vllm.declarations`: what is declared, in warcore's vocabulary (each runner's
  staging: guard, depth, release, host reads; the staging ring's users; the scheduler's
  deferred free). Pure data.

Importing this package imports neither vLLM, nor torch, nor warcore (the entry point must be
able to name a broken warcore in its start-up line).
"""

from __future__ import annotations

from ._entry import ENV_ACTIVATE

__all__ = ["ENV_ACTIVATE", "install", "is_installed", "uninstall"]

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
