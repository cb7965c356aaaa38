"""A post-import hook: run a callback on a module right after it is first imported.

An engine imports its runner modules late (a worker process imports the model runner only when
it builds it), while an integration is installed first thing in every process (the engine's
plugin loader), and importing those modules itself would make every process pay for them. So
an integration checks and patches what is imported already and puts a
:class:`PostImportFinder` at the front of ``sys.meta_path`` for the rest: each callback runs
once, right after the real loader executed the module, before the importer sees it. A callback
must not raise (the engine's import would fail): wrap it.

Standard library only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["PostImportFinder"]


class _CallbackLoader(importlib.abc.Loader):
    """Runs the real loader, then the finder's callback for the module it loaded (taken only
    then: a spec found but never executed, ``importlib.util.find_spec`` say, or a module whose
    execution raised, leaves it for the next import)."""

    def __init__(self, loader: Any, finder: PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        callback = self._finder.callbacks.pop(module.__name__, None)
        if callback is not None:
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for inspect
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Calls ``callbacks[name](module)`` right after module ``name`` is first imported; the
    callbacks not run yet stay in :attr:`callbacks`."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = dict(callbacks)
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, self)
        return spec
