"""An integration's activation in one engine process: install, settle, take off, restore.

An engine loads its plugins first thing in every process, long before it imports the modules an
integration patches (a worker imports its model runner only when it builds one), and importing
them early would make every process pay for them. So :meth:`Activation.install` checks and
patches the watched modules already imported and hooks the first import of the others
(:class:`~warcore.integration.post_import.PostImportFinder`). Each watched module is checked
where it is imported, against the installed release's entry (its functions' signatures and
digests, its structural checks), and only then given its check-and-patch step. The activation
is *settled* once every watched module passed; :meth:`Activation.checkpoint` imports the ones
still pending (or names those that no longer exist). Any failed check or patch, wherever it
happens, takes the activation off: every patched attribute is put back exactly, and the
engine's own decisions apply, said once.

The engine's side is data and steps: which release is installed (the gate,
:func:`~warcore.integration.releases.pick`), a step per watched module, how to describe the
engine in a sentence, what applies when warcore is off, and what to forget when it goes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType

from .checks import ClassTree
from .engine_code import ShapeMismatch, check_functions, resolve_class
from .patching import Patcher
from .post_import import PostImportFinder
from .releases import Release, UnsupportedRelease

__all__ = ["Activation", "Step"]

Step = Callable[[ModuleType], None]
"""A watched module's patch step, run once the module passed its checks."""


class Activation:
    """One engine integration's activation in this process (at most one installed at once).

    ``describe()`` names the engine installed (``sglang 0.5.22 at /site-packages/sglang``),
    ``fallback`` says what applies without warcore (``sglang's own barrier decisions apply``).
    """

    def __init__(
        self, name: str, logger: logging.Logger, describe: Callable[[], str], fallback: str
    ) -> None:
        self.name = name
        self.logger = logger
        self.describe = describe
        self.fallback = fallback
        self.lock = threading.RLock()
        self.release: Release | None = None
        """The installed release's entry; ``None`` when not installed."""
        self.patcher = Patcher(self._failed, self.lock)
        self.pending: set[str] = set()
        """Watched modules not checked and patched yet (not the hook's own list: a watched
        module may import another before its own check ran)."""
        self.settled = False
        self.seconds = 0.0
        """Time spent after :meth:`install` returned: checking and patching the watched
        modules as the engine imports them, and the checkpoint."""
        self.degraded_check: str | None = None
        """The check that failed where the activation last took itself off."""
        self.taken_off: str | None = None
        """Why the activation last took itself off (``None``: it did not)."""
        self._finder: PostImportFinder | None = None
        self._on_settled: Callable[[str | None], None] | None = None
        self._on_off: Callable[[], None] | None = None

    @property
    def installed(self) -> bool:
        return self.release is not None

    @property
    def version(self) -> str:
        return self.release.version if self.release is not None else ""

    # -- install, uninstall ----------------------------------------------------------------

    def install(
        self,
        release: Release,
        steps: Mapping[str, Step],
        *,
        on_settled: Callable[[str | None], None] | None = None,
        on_off: Callable[[], None] | None = None,
    ) -> None:
        """Check and patch the watched modules of ``release`` imported now, and hook the
        others' first import (idempotent). ``steps`` maps each step name ``release.watched``
        uses to its step. ``on_settled`` is told once: ``None`` when every watched module is
        checked and patched, or why the activation took itself off; ``on_off`` runs whenever
        it comes off. Raises :class:`UnsupportedRelease` when an imported module fails its
        checks (nothing stays patched)."""
        with self.lock:
            if self.release is not None:
                return
            unknown = sorted(set(release.watched.values()) - set(steps))
            if unknown:
                raise ValueError(f"release {release.version} names unknown steps {unknown}")
            self.release, self.patcher = release, Patcher(self._failed, self.lock)
            self.settled, self.seconds, self.degraded_check, self.taken_off = False, 0.0, None, None
            self._on_off = on_off
            watch = {m: functools.partial(self._run, steps[s]) for m, s in release.watched.items()}
            self.pending = set(watch)
            self._finder = PostImportFinder(
                {m: functools.partial(self._on_import, cb) for m, cb in watch.items()}
            )
            sys.meta_path.insert(0, self._finder)
            try:
                for module, callback in watch.items():
                    if module in sys.modules:
                        callback(sys.modules[module])
                        self.pending.discard(module)
            except Exception as exc:
                reason = (
                    self._differs(exc.check, exc.detail) if isinstance(exc, ShapeMismatch) else ""
                )
                self._off()
                if reason:
                    raise UnsupportedRelease(reason) from None
                raise
            self._on_settled = on_settled
        self._settle_if_done()

    def uninstall(self) -> bool:
        """Put every patched attribute back exactly and remove the hook (idempotent); whether
        it was installed."""
        return self._off() is not None

    # -- checking ----------------------------------------------------------------------------

    def check_module(self, module: ModuleType) -> None:
        """The installed release's checks of ``module``: its structural checks (a class tree's
        later subclasses are checked as they are defined), then its relied-on functions."""
        release = self.release
        assert release is not None
        for check in release.checks.get(module.__name__, ()):
            if isinstance(check, ClassTree):
                root: type = resolve_class(module, check.cls)
                self.patcher.on_subclasses(
                    root,
                    f"tree {check.cls}",
                    functools.partial(_check_tree_class, check, root),
                )
            else:
                check.live(module)
        check_functions(module, release.functions_of(module.__name__), release.version)

    def check_class(self, cls: type) -> None:
        """The installed release's relied-on functions of class ``cls`` only (a class seen
        while its class statement runs: its module does not name it yet)."""
        release = self.release
        assert release is not None
        module = sys.modules[cls.__module__]
        prefix = cls.__qualname__ + "."
        audited = {
            q: row
            for q, row in release.functions_of(cls.__module__).items()
            if q.startswith(prefix)
        }
        if getattr(module, cls.__qualname__, None) is not cls and "." not in cls.__qualname__:
            view = ModuleType(module.__name__)
            vars(view).update(vars(module))
            setattr(view, cls.__qualname__, cls)
            module = view
        check_functions(module, audited, release.version)

    def audits(self, cls: type) -> bool:
        """The installed release relies on functions of class ``cls``."""
        release = self.release
        prefix = cls.__qualname__ + "."
        rows = release.functions_of(cls.__module__) if release is not None else {}
        return any(q.startswith(prefix) for q in rows)

    def _run(self, step: Step, module: ModuleType) -> None:
        self.check_module(module)
        step(module)

    # -- settling ---------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Settle now: import each watched module not imported yet (its checks and step run),
        or name the one that no longer exists and take the activation off."""
        if self.release is None:
            return
        start = time.perf_counter()
        for name in sorted(self.pending):
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                self.take_off(f"module {name}", "watched, and not in this release (moved?)")
                return
            try:
                importlib.import_module(name)
            except ImportError:  # a GPU build's import: this process never uses its points
                self.pending.discard(name)
            if self.release is None:
                return  # it failed its check
        self.seconds += time.perf_counter() - start
        self._settle_if_done()

    def not_needed(self, module: str) -> None:
        """A watched module this process will not import (the engine built another runner
        than the one that module holds): no longer waited for, nor checked or patched if it is
        imported after all; the activation settles if it was the last one pending."""
        with self.lock:
            if self.release is None or module not in self.pending:
                return
            self.pending.discard(module)
            if self._finder is not None:
                self._finder.callbacks.pop(module, None)
        self._settle_if_done()

    def _on_import(self, callback: Step, module: ModuleType) -> None:
        start = time.perf_counter()
        self.patcher.guarded(module.__name__, callback, module)
        if self.release is not None:
            self.pending.discard(module.__name__)
            self.seconds += time.perf_counter() - start
            self._settle_if_done()

    def _settle_if_done(self) -> None:
        with self.lock:
            if self.release is None or self.settled or self.pending:
                return
            self.settled = True
            self._remove_finder()
        self._tell(None)

    def _tell(self, reason: str | None) -> None:
        callback, self._on_settled = self._on_settled, None
        if callback is not None:
            callback(reason)
        elif reason is not None:
            self.logger.error(
                "%s: warcore taken off in process %d: %s", self.name, os.getpid(), reason
            )
        else:
            self.logger.info(
                "%s: warcore active in process %d (%s; every watched module checked and patched)",
                self.name,
                os.getpid(),
                self.describe(),
            )

    # -- taking off ---------------------------------------------------------------------------

    def take_off(self, check: str, detail: str) -> None:
        """A check (or a patch) failed: put everything back; the engine's own decisions
        apply, said once."""
        if self.release is None:
            return
        reason = self._differs(check, detail)
        if self._off() is not None:
            self.degraded_check, self.taken_off = check, reason
            self._tell(reason)

    def _failed(self, what: str, exc: Exception) -> None:
        if isinstance(exc, ShapeMismatch):
            self.take_off(exc.check, exc.detail)
        else:
            self.take_off(f"patching {what}", f"{type(exc).__name__}: {exc}")

    def _differs(self, check: str, detail: str) -> str:
        return (
            f"{self.describe()} differs from the audited {self.version} at {check}: {detail}; "
            f"{self.fallback}"
        )

    def _off(self) -> Release | None:
        with self.lock:
            release = self.release
            if release is None:
                return None
            self._remove_finder()
            self.patcher.restore()
            self.release = None
            self.settled = False
        if self._on_off is not None:
            self._on_off()
        return release

    def _remove_finder(self) -> None:
        if self._finder is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self._finder)
            self._finder = None


def _check_tree_class(tree: ClassTree, root: type, cls: type) -> None:
    tree.check_class(cls, root)
