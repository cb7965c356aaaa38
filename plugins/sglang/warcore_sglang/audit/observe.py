"""Observation points in a running sglang process, shared by the trace and the sanitizer.

Four places are wrapped, each only while a listener is installed (:func:`install`), and put back
exactly by :func:`uninstall`:

* ``ModelRunner.shared_read_done_event`` (the mailbox every sglang runner publishes its
  read-done event into: the eager prefill gate, the decode graph runner before, in or after its
  replay, the EAGLE draft-extend runner) becomes a data descriptor: a runner that stores an
  event there is a publish, seen at the moment it happens (in host program order, right after
  the event was recorded), with the publishing code found on the caller's frames;
* ``ModelRunner.forward``: the forward batch being run, and its end;
* ``Scheduler.run_batch``: the schedule batch being run (its request ids);
* ``Scheduler._apply_war_barrier``: the barrier itself. Its ``schedule_stream`` is swapped for
  a recording proxy while it runs, so the branch it took (``wait_event`` on which event, or
  ``wait_stream``) is observed, not re-derived.

Nothing here changes a decision: with a listener that does nothing, sglang behaves as without.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported in install(): this module is the standard library's only
    from warcore.integration.patching import Patcher
    from warcore.integration.post_import import PostImportFinder

_log = logging.getLogger("warcore_sglang")

__all__ = [
    "Barrier",
    "Listener",
    "Publish",
    "attach",
    "current_batch",
    "detach",
    "install",
    "uninstall",
]

SRT = "sglang.srt."
MODEL_RUNNER = SRT + "model_executor.model_runner"
SCHEDULER = SRT + "managers.scheduler"
_MAILBOX = "shared_read_done_event"
_PUBLISHERS = ("maybe_publish_prefill_shared_read_done", "_publish_read_done")
"""The functions of every audited sglang that store a fresh read-done event into the mailbox
(0.5.21's EAGLE draft-extend runner stores its own); the frame that called them is the runner
that published."""


@dataclass(frozen=True)
class Publish:
    """One read-done event stored into a model runner's mailbox."""

    model_runner: Any
    event: Any
    record_point: str
    """``pre_replay``, ``in_replay``, ``post_replay`` (the runner's resolved ``SharedReadEnds``
    for that publish, read off its frame), or ``unknown``."""
    publisher: str
    """The runner code that published, e.g. ``EagerRunner._execute_extend``."""


@dataclass
class Barrier:
    """One call of ``Scheduler._apply_war_barrier``, as it happened."""

    scheduler: Any
    owner: Any
    """The runner it took the event from (``model_worker.last_shared_read_runner``)."""
    event: Any
    """The event that runner held when the barrier ran (``None``: nothing was published)."""
    waits: list[tuple[str, Any]] = field(default_factory=list)
    """What the schedule stream was told: ``("wait_event", event)`` or
    ``("wait_stream", stream)``; empty when the barrier is off, or when it waited some other
    way (on the host, say: sglang #31072)."""
    enabled: bool = False
    """The scheduler's ``_war_barrier_enabled``."""
    loop: str = ""
    """The scheduler loop that applied it (``event_loop_overlap``,
    ``event_loop_overlap_disagg_prefill``, ...; empty when none is found near the call)."""


class Listener:
    """Receives what the observation points see; every method may be left as it is."""

    def on_publish(self, publish: Publish) -> None: ...

    def on_forward_end(self, model_runner: Any, forward_batch: Any) -> None: ...

    def on_barrier(self, barrier: Barrier) -> None: ...

    def on_transfer(self, transfer: Any) -> None:
        """A decode side hands KV slots to the transfer engine
        (:class:`warcore_sglang.activation._disagg.Transfer`; warcore active only)."""


_lock = threading.RLock()
_listeners: list[Listener] = []
_patcher: Patcher | None = None
_finder: PostImportFinder | None = None
_local = threading.local()


def listening() -> bool:
    """Anything observes this process (the trace, the sanitizer)."""
    return bool(_listeners)


def transfer(what: Any) -> None:
    """Tell the listeners of a transfer (see :meth:`Listener.on_transfer`)."""
    _each("on_transfer", what)


def current_batch() -> Any:
    """The ``ScheduleBatch`` this thread's scheduler is running (``None`` outside
    ``Scheduler.run_batch``)."""
    return getattr(_local, "batch", None)


def current_forward(model_runner: Any) -> Any:
    """The ``ForwardBatch`` ``model_runner`` is running on this thread, or ``None``."""
    stack = getattr(_local, "forwards", None)
    if stack:
        for runner, batch in reversed(stack):
            if runner is model_runner:
                return batch
    return None


@contextmanager
def _pushed(name: str, value: Any) -> Iterator[None]:
    stack = getattr(_local, name, None)
    if stack is None:
        stack = []
        setattr(_local, name, stack)
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def _each(method: str, *args: Any) -> None:
    # A diagnostic never takes the server down: a listener that fails (a full disk under the
    # trace, say) is named once and dropped; sglang's call goes on as if it were not there.
    for listener in list(_listeners):
        try:
            getattr(listener, method)(*args)
        except Exception as exc:
            _log.error(
                "warcore-sglang: the %s stopped (%s in %s: %s); sglang runs on as it would",
                getattr(listener, "name", type(listener).__name__),
                type(exc).__name__,
                method,
                exc,
            )
            with contextlib.suppress(ValueError):
                _listeners.remove(listener)


# -- where a publish came from --------------------------------------------------------------


def _publisher(frame: FrameType | None) -> tuple[str, str]:
    """(record point, publishing code) from the frames above a mailbox store."""
    point = "unknown"
    depth = 0
    while frame is not None and depth < 8:
        code = frame.f_code
        ends = frame.f_locals.get("shared_read_ends")
        if code.co_name == "_publish_read_done" and frame.f_locals.get("in_graph") is True:
            point = "in_replay"
        elif point == "unknown" and ends is not None and hasattr(ends, "name"):
            point = str(ends.name).lower()
        ours = str(frame.f_globals.get("__name__", "")).startswith("warcore_sglang.")
        if code.co_name not in _PUBLISHERS and not ours:  # warcore's wrappers are passed by
            return point, getattr(code, "co_qualname", code.co_name)
        frame = frame.f_back
        depth += 1
    return point, "unknown"


class _Mailbox:
    """``ModelRunner.shared_read_done_event``: the value lives in the instance's ``__dict__``
    as before; storing an event there tells the listeners."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return obj.__dict__.get(_MAILBOX)

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[_MAILBOX] = value
        if value is not None and _listeners:
            point, publisher = _publisher(sys._getframe(1))
            _each("on_publish", Publish(obj, value, point, publisher))


class _RecordingStream:
    """The schedule stream during one barrier: forwards every call, notes the waits."""

    def __init__(self, stream: Any, waits: list[tuple[str, Any]]) -> None:
        self._stream = stream
        self._waits = waits

    def wait_event(self, event: Any) -> Any:
        self._waits.append(("wait_event", event))
        return self._stream.wait_event(event)

    def wait_stream(self, stream: Any) -> Any:
        self._waits.append(("wait_stream", stream))
        return self._stream.wait_stream(stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# -- the wrappers ---------------------------------------------------------------------------


def _set(owner: Any, attr: str, value: Any) -> None:
    assert _patcher is not None
    _patcher.set(owner, attr, value)


def _wrap(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    """Wrap ``owner.attr`` where the owner defines it; where it does not (renamed, moved),
    that observation is off, said in one line."""
    original = vars(owner).get(attr)
    if not callable(original):
        _log.error(
            "warcore-sglang: %s.%s is not there: that observation is off (the trace and the "
            "sanitizer see less; sglang runs as it would)",
            owner.__qualname__,
            attr,
        )
        return
    _set(owner, attr, make(original))


def _first_parameter(function: Any) -> str | None:
    try:
        params = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return params[1] if len(params) > 1 else None


def _on_model_runner(module: ModuleType) -> None:
    cls = module.ModelRunner

    def make_forward(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            with _pushed("forwards", (self, forward_batch)):
                try:
                    return original(self, forward_batch, *args, **kwargs)
                finally:
                    _each("on_forward_end", self, forward_batch)

        return forward

    if _first_parameter(vars(cls).get("forward")) == "forward_batch":
        _wrap(cls, "forward", make_forward)
    else:
        _log.error(
            "warcore-sglang: ModelRunner.forward(self, forward_batch, ...) is not there: "
            "forwards are not observed (no sanitizer)"
        )
    if _MAILBOX in vars(cls):  # sglang made it a class attribute: never shadow its logic
        _log.error(
            "warcore-sglang: ModelRunner.%s is a class attribute: publishes are not "
            "observed (no publish records, no sanitizer)",
            _MAILBOX,
        )
    else:
        _set(cls, _MAILBOX, _Mailbox())


def _observed_barrier(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _apply_war_barrier(self: Any) -> Any:
        enabled = bool(getattr(self, "_war_barrier_enabled", False))
        try:
            owner = self.model_worker.last_shared_read_runner if enabled and _listeners else None
            barrier = Barrier(self, owner, getattr(owner, _MAILBOX, None), enabled=enabled)
            barrier.loop = _calling_loop(sys._getframe(1)) if _listeners else ""
        except Exception:  # observing never changes what the barrier does
            barrier = Barrier(self, None, None, enabled=enabled)
            owner = None
        stream = getattr(self, "schedule_stream", None)
        swap = owner is not None and stream is not None
        if swap:
            self.schedule_stream = _RecordingStream(stream, barrier.waits)
        try:
            return original(self)
        finally:
            if swap:
                self.schedule_stream = stream
            if _listeners:
                _each("on_barrier", barrier)

    return _apply_war_barrier


def _calling_loop(frame: FrameType | None) -> str:
    """The ``event_loop*`` function below the barrier (a few wrappers deep at most): which
    loop, the normal one or a disaggregated side's, a barrier belongs to."""
    for _ in range(6):
        if frame is None:
            break
        if frame.f_code.co_name.startswith("event_loop"):
            return frame.f_code.co_name
        frame = frame.f_back
    return ""


def _on_scheduler(module: ModuleType) -> None:
    cls = module.Scheduler

    def make_run_batch(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            previous = getattr(_local, "batch", None)
            _local.batch = batch
            try:
                return original(self, batch, *args, **kwargs)
            finally:
                _local.batch = previous

        return run_batch

    _wrap(cls, "run_batch", make_run_batch)
    _wrap(cls, "_apply_war_barrier", _observed_barrier)


_WATCH: dict[str, Callable[[ModuleType], None]] = {
    MODEL_RUNNER: _on_model_runner,
    SCHEDULER: _on_scheduler,
}


def _failed(what: str, exc: Exception) -> None:
    _log.error("warcore-sglang: observing %s failed (%s: %s)", what, type(exc).__name__, exc)


def _apply(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    """A module's observation points, patched where they are as audited; a failure is one line
    and leaves that module unobserved, never an error in sglang's import."""
    with _lock:
        if not _listeners:
            return
        try:
            callback(module)
        except Exception as exc:
            _log.error(
                "warcore-sglang: observing %s failed (%s: %s): not observed (the trace and the "
                "sanitizer see less; sglang runs as it would)",
                module.__name__,
                type(exc).__name__,
                exc,
            )


_named: dict[str, Listener] = {}
L = TypeVar("L", bound=Listener)


def attach(listener: L) -> L:
    """Install ``listener`` unless one of its ``name`` is installed already: that one is
    returned (a process has one trace and one sanitizer, however often asked)."""
    with _lock:
        found = _named.get(getattr(listener, "name", ""))
        if found is not None:
            return found  # type: ignore[return-value]
        _named[getattr(listener, "name", "")] = listener
        install(listener)
        return listener


def detach(name: str) -> None:
    """Uninstall the listener :func:`attach` installed under ``name`` (if any)."""
    with _lock:
        listener = _named.pop(name, None)
        if listener is not None:
            uninstall(listener)


def install(listener: Listener) -> None:
    """Start telling ``listener`` what happens (the first listener patches sglang: what is
    imported now, and the rest when it is imported)."""
    global _finder, _patcher
    from warcore.integration.patching import Patcher
    from warcore.integration.post_import import PostImportFinder

    with _lock:
        first = not _listeners
        _listeners.append(listener)
        if not first:
            return
        _patcher = Patcher(_failed, _lock)
        pending: dict[str, Callable[[ModuleType], None]] = {}
        for name, callback in _WATCH.items():
            module = sys.modules.get(name)
            if module is not None:
                _apply(callback, module)
            else:
                pending[name] = functools.partial(_apply, callback)
        _finder = PostImportFinder(pending)
        sys.meta_path.insert(0, _finder)


def uninstall(listener: Listener | None = None) -> None:
    """Stop telling ``listener`` (every listener when ``None``); the last one out restores
    every wrapped attribute."""
    global _finder
    with _lock:
        if listener is None:
            _listeners.clear()
            _named.clear()
        elif listener in _listeners:
            _listeners.remove(listener)
            for name in [n for n, one in _named.items() if one is listener]:
                del _named[name]
        if _listeners:
            return
        if _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
        _finder = None
        if _patcher is not None:
            _patcher.restore()
