"""sglang's plugin entry point (group ``sglang.srt.plugins``, name ``warcore``).

sglang's ``load_plugins()`` calls :func:`sglang_plugin` first thing in every server process:
the launcher, ``Engine``, each scheduler child, the detokenizer, the DP controller; a Ray
``SchedulerActor``, which builds its scheduler without ``load_plugins()``, calls
:func:`scheduler_actor` through the constructor the ``RayEngine``'s own process wrapped
(:mod:`warcore_sglang._ray`). Here, in that order:

1. ``WARCORE_SGLANG=1``: activate warcore (:func:`warcore_sglang.activation.install`) in
   every process that may build a model runner (:data:`NO_RUNNER`: not the launcher, the
   ``Engine``'s own process, the detokenizer or the DP controller);
2. ``WARCORE_SGLANG_TRACE=FILE``: trace the process (:mod:`warcore_sglang.audit.trace`), warcore
   active or not; ``WARCORE_SGLANG_SANITIZE``: the sanitizer (:mod:`warcore_sglang.audit.sanitize`);
3. one start-up line: whether warcore is active in this process and with which plugins, or
   why not (also written to the trace as a ``process`` record), naming the process as sglang
   describes it (:func:`_described`).

Which process this is: sglang describes each of its processes when it publishes the process's
runtime context (``sglang.srt.runtime_context.publish(server_args, role=..., ranks=
SpawnRanks(...))``, 0.5.21 to 0.5.23), right *after* ``load_plugins()``. So the decision made
here, whether this process may build a model runner (:data:`NO_RUNNER`), can only read which
sglang function loads the plugins (:data:`_ROLES`); the start-up line, said once the
activation settled (in a scheduler: while its ``Scheduler`` is built, after sglang published),
names the role and ranks sglang published, a scheduler's with its disaggregation mode
(``prefill scheduler``, ``decode scheduler``). A line said before sglang published (a process
that does not activate says it at once) names the process by that function.

This module, and the trace and sanitizer modules it imports, import nothing but the standard
library at import time (never ``warcore``, ``torch`` or sglang), so that a broken or shadowed
``warcore`` (a folder named ``warcore`` without ``__init__.py`` in the directory a
``python -m`` runs from comes first on ``sys.path`` and hides the installed package) is named
in that line, instead of sglang's own "Failed to load plugin warcore" (sglang then serves
without warcore); and so that a process not asked to activate (``WARCORE_SGLANG`` unset) pays
nothing. Settings are read with warcore's own spelling (:mod:`warcore.integration.settings`)
once warcore is known to be importable. Never raises.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from . import ENV_ACTIVATE, _ray, shadowed
from .audit.sanitize import ENV_SANITIZE
from .audit.trace import ENV_TRACE

__all__ = ["Status", "scheduler_actor", "shadowed", "sglang_plugin", "startup_line"]

logger = logging.getLogger("warcore.sglang")

_ROLES = {
    "run_scheduler_process": "scheduler",
    "run_detokenizer_process": "detokenizer",
    "run_data_parallel_controller_process": "dp-controller",
    "__init__": "engine",
    "launch_server": "launcher",
    "run_server": "launcher",
    "main": "launcher",
    "<module>": "launcher",  # sglang/launch_server.py calls it at module level
}
"""The audited releases' functions that call ``load_plugins()`` -> the process's role (0.5.21
calls it in the launcher, the ``Engine`` and each scheduler only): what this entry point knows
of its process when it decides, before sglang described it (:func:`_described`)."""
_RANKS = ("tp", "pp", "dp")
_RUNTIME_CONTEXT = "sglang.srt.runtime_context"
_PUBLISHED = {"dp_controller": "dp-controller"}
"""sglang's published roles spelled as this module's (the others as sglang spells them)."""
_MODES = frozenset({"prefill", "decode"})
"""The disaggregation modes a scheduler is named by (``null``: not disaggregated)."""
NO_RUNNER = frozenset({"engine", "launcher", "detokenizer", "dp-controller"})
"""Roles of sglang processes that build no model runner (sglang starts every scheduler in a
process of its own, ``mp.Process(target=run_scheduler_process)``): they make no WAR decision,
so activating there would only cost their start-up (importing warcore and its plugins: 0.3 s
to 1 s measured here, on the ``Engine`` process's critical path). Any other role, including
one this table does not know, is activated."""


@dataclass
class Status:
    """What :func:`sglang_plugin` did in this process."""

    pid: int
    role: str
    rank: dict[str, Any]
    active: bool
    reason: str | None
    """Why warcore is not active (``None`` when it is)."""
    level: int
    left_to_schedulers: bool = False
    """``WARCORE_SGLANG=1``, but this process builds no model runner: not activated here."""
    plugins: list[dict[str, Any]] = field(default_factory=list)
    activation_s: float | None = None
    """How long activating took in this process (importing warcore, loading its plugins,
    patching what sglang had imported): warcore's own start-up cost."""
    release: str | None = None
    """The sglang release in force (its audited entry) while warcore is active."""
    trace: str | None = None
    sanitize: str | None = None
    problems: list[str] = field(default_factory=list)
    settled: bool = True
    """Whether the activation is settled (its line can be said): always, but while installed
    and waiting for sglang's modules to be imported and checked."""
    ready: bool = False
    """Whether :func:`sglang_plugin` has done its own part (the trace is set up)."""
    said: bool = False
    ray: str | None = None
    """What this process did for Ray's scheduler actors (a ``RayEngine``'s process)."""


def _role() -> tuple[str, dict[str, Any]]:
    """The role of this process, from the sglang function that called ``load_plugins()``
    (and, in a scheduler child, its ranks, from that function's arguments)."""
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < 12:
        if frame.f_code.co_name == "load_plugins" and frame.f_back is not None:
            caller = frame.f_back
            role = _ROLES.get(caller.f_code.co_name, caller.f_code.co_name)
            rank = {}
            if role == "scheduler":
                local = caller.f_locals
                rank = {k: local.get(f"{k}_rank") for k in _RANKS}
            return role, rank
        frame = frame.f_back  # type: ignore[assignment]
        depth += 1
    return "process", {}


def _described() -> tuple[str, dict[str, Any]] | None:
    """This process as sglang describes it, ``None`` until it published one: the role of its
    runtime context (``publish_role()``) and, for a scheduler, its ranks (the parallel
    context's ``tp_rank``, ``pp_rank``, ``dp_rank``, published from its ``SpawnRanks``) and its
    disaggregation mode (``get_server_args().disaggregation_mode``). Reads what is imported
    already; never raises."""
    context = sys.modules.get(_RUNTIME_CONTEXT)
    try:
        published = context.publish_role() if context is not None else None
        if not isinstance(published, str) or not published:
            return None
        role = _PUBLISHED.get(published, published)
        if role != "scheduler":
            return role, {}
        parallel = context.get_parallel()  # type: ignore[union-attr]
        rank = {k: _published_rank(parallel, k) for k in _RANKS}
        mode = getattr(context.get_server_args(), "disaggregation_mode", None)  # type: ignore[union-attr]
    except Exception:  # a release that describes its processes otherwise: the entry's guess
        return None
    return (f"{mode} scheduler" if mode in _MODES else role), rank


def _published_rank(parallel: Any, kind: str) -> Any:
    """One rank of sglang's parallel context (``None`` where it was not published: the
    context raises for a name never written)."""
    try:
        return getattr(parallel, f"{kind}_rank")
    except Exception:
        return None


_LAUNCHER = "python -m warcore_sglang.serving.launch_server"


def _asked() -> bool:
    """Anything of warcore-sglang is asked for in this process (a ``WARCORE_SGLANG*`` variable
    set); else nothing is imported."""
    return any(k.startswith(ENV_ACTIVATE) and v.strip() for k, v in os.environ.items())


def _refused_as_shadowed(status: Status) -> bool:
    where = shadowed("warcore")
    if where is not None:
        status.reason = (
            f"the package 'warcore' is shadowed by the folder {where} (no __init__.py; "
            "python -m and python -c put the working directory first on sys.path): run from "
            "another directory or rename that folder"
        )
        status.level = logging.ERROR
    return where is not None


def _declined(status: Status, actor: Any) -> bool:
    """Whether this process does not activate: the switch is off, it builds no model runner,
    or (a Ray scheduler actor) its constructor is not the audited code."""
    from warcore.integration.settings import switch

    on, problem = switch(os.environ, ENV_ACTIVATE)
    if not on:
        flag = os.environ.get(ENV_ACTIVATE, "").strip().lower()
        status.reason = f"{ENV_ACTIVATE}={flag!r} (set it to 1, or launch with {_LAUNCHER})"
        # A value that is neither on nor off is an operator's mistake: say so loudly.
        status.level = logging.WARNING if problem is not None else logging.INFO
        return True
    if status.role in NO_RUNNER:
        status.left_to_schedulers = True
        status.reason = (
            "left to the scheduler processes (this one builds no model runner; "
            "warcore_sglang.install() activates it here anyway)"
        )
        return True
    why = _ray.unaudited(actor) if actor is not None else None
    if why is not None:
        status.reason = f"Ray's scheduler actor is not the audited code: {why}"
        status.level = logging.ERROR
    return why is not None


def _activate(status: Status, actor: Any = None) -> None:
    """Activate warcore here (``actor``: the constructor of the Ray scheduler actor this
    process is, checked first)."""
    if _declined(status, actor):
        return
    start = time.perf_counter()
    try:
        from . import activation

        status.settled = False
        activation.install(on_settled=lambda reason: _settled(status, reason))
        import warcore

        from .activation import _state

        state = _state.current
        status.release = state.release.version if state is not None else None

        status.plugins = [
            {
                "name": p.name,
                "distribution": p.distribution,
                "version": p.version,
                "status": p.status,
            }
            for p in warcore.get_plugin_manager().plugin_infos
        ]
        status.active = True
        status.level = logging.INFO
        status.activation_s = time.perf_counter() - start
    except Exception as exc:
        status.settled = True
        status.reason = f"{type(exc).__name__}: {exc}"
        status.level = logging.ERROR


def _settled(status: Status, reason: str | None) -> None:
    """The activation is settled: every watched module checked and patched (``None``), or it
    took itself off (why). The start-up line is said now, not before: "active" only once it is
    true."""
    if reason is not None:
        status.active = False
        status.reason = reason
        status.level = logging.ERROR
    from .activation import _state

    if status.activation_s is not None:
        status.activation_s += _state.activation.seconds  # checking and patching sglang's modules
    status.settled = True
    if status.ready:
        _finish(status)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _settings_problems(status: Status) -> None:
    """A bad rank-check or meter-control setting is said in the start-up line (each falls
    back: the check off or the core's timeout, no control batches), not found at the end of
    ``Scheduler.__init__``."""
    from .settings import check_ranks_mode, meter_control, timeout_s

    settings = (check_ranks_mode(os.environ), timeout_s(os.environ), meter_control(os.environ))
    for _, problem in settings:
        if problem is not None:
            status.problems.append(problem)
            status.level = max(status.level, logging.WARNING)


def _observe(status: Status) -> None:
    """The trace and the sanitizer, each said in the start-up line: on, or off and why."""
    from warcore.integration.settings import FALSE, TRUE

    path = os.environ.get(ENV_TRACE, "").strip()
    mode = os.environ.get(ENV_SANITIZE, "").strip().lower()
    if mode in TRUE:
        mode = "all"
    if mode in FALSE:
        mode = ""
    if mode and not path:
        status.problems.append(f"{ENV_SANITIZE}={mode!r} needs {ENV_TRACE}=FILE: sanitizer off")
        status.level = max(status.level, logging.WARNING)
        mode = ""
    if not path:
        return
    path = os.path.abspath(path)
    try:
        from .audit import trace

        # a real write, now, not at the first barrier (/dev/full opens, and takes nothing)
        trace.write_record(path, {"kind": "open", "pid": status.pid, "t": time.time()})
        trace.install(path)
    except Exception as exc:
        status.problems.append(f"trace off: {path}: {_reason(exc)}")
        status.level = max(status.level, logging.ERROR)
        return
    status.trace = path
    if mode:
        _sanitize(status, path, mode)


def _sanitize(status: Status, path: str, mode: str) -> None:
    from .audit import sanitize

    if mode not in sanitize.MODES:
        problem = f"{ENV_SANITIZE}={mode!r} is not one of {', '.join(sanitize.MODES)}"
        status.problems.append(f"sanitizer off: {problem}")
        status.level = max(status.level, logging.WARNING)
        return
    try:
        sanitize.install(path, mode)
    except Exception as exc:
        status.problems.append(f"sanitizer off: {_reason(exc)}")
        status.level = max(status.level, logging.ERROR)
        return
    status.sanitize = mode


def startup_line(status: Status) -> str:
    who = f"warcore-sglang: process {status.pid} ({status.role}"
    rank = ", ".join(f"{k} {v}" for k, v in status.rank.items() if v is not None)
    who += f", {rank})" if rank else ")"
    if status.active:
        loaded = [p for p in status.plugins if p["status"] == "active"]
        names = ", ".join(f"{p['name']} ({p['distribution']} {p['version']})" for p in loaded)
        failed = [p["name"] for p in status.plugins if p["status"] == "failed"]
        took = f" in {status.activation_s:.3f} s" if status.activation_s is not None else ""
        text = f"{who}: warcore active on sglang {status.release}{took}; "
        text += f"plugins: {names or 'none'}"
        if failed:
            text += f"; failed to load: {', '.join(failed)}"
    elif status.left_to_schedulers:
        text = f"{who}: warcore {status.reason}"
    else:
        text = f"{who}: warcore NOT active: {status.reason}"
    if status.ray:
        text += f"; {status.ray}"
    if status.trace:
        text += f"; trace {status.trace}"
    if status.sanitize:
        text += f"; sanitizer {status.sanitize}"
    for problem in status.problems:
        text += f"; {problem}"
    return text


def _emit(level: int, line: str) -> None:
    try:
        from warcore.integration.settings import emit
    except ImportError:  # warcore shadowed or broken: the line is never lost
        print(f"[{logging.getLevelName(level)}] {line}", file=sys.stderr, flush=True)
        return
    emit(logger, level, line)


def _finish(status: Status) -> None:
    """Say the start-up line, once, and write it to the trace first (a trace that cannot take
    it is off, and the line says so)."""
    if status.said:
        return
    status.said = True
    described = _described()
    if described is not None:
        status.role, status.rank = described
    if status.trace:
        try:
            _write_process_record(status)
        except Exception as exc:
            from .audit import sanitize, trace

            sanitize.uninstall()
            trace.uninstall()
            status.problems.append(f"trace off: {status.trace}: {_reason(exc)}")
            status.trace = status.sanitize = None
            status.level = max(status.level, logging.ERROR)
    _emit(status.level, startup_line(status))


def _write_process_record(status: Status) -> None:
    from .audit import trace

    line = startup_line(status)
    trace.write_record(
        str(status.trace),
        {
            "kind": "process",
            "pid": status.pid,
            "ppid": os.getppid(),
            "role": status.role,
            "rank": status.rank,
            "active": status.active,
            "reason": status.reason,
            "left_to_schedulers": status.left_to_schedulers,
            "plugins": status.plugins,
            "activation_s": status.activation_s,
            "sanitize": status.sanitize,
            "status": line.split("): ", 1)[-1],
            "line": line,
        },
    )


def sglang_plugin() -> Status | None:
    """The entry point (see the module docstring). Returns what it did (``None`` if it
    failed, which it logs). In a process that activates, the start-up line waits until the
    activation is settled (every watched sglang module checked and patched, at the latest at
    the end of ``Scheduler.__init__``)."""
    try:
        role, rank = _role()
        return _start(role, rank)
    except Exception as exc:  # never take sglang's start-up down
        _failed(exc)
        return None


def scheduler_actor(constructor: Any, arguments: dict[str, Any]) -> Status | None:
    """A Ray ``SchedulerActor`` of a ``RayEngine``, before its ``Scheduler`` is built (called
    by the constructor :mod:`warcore_sglang._ray` wrapped, with sglang's ``constructor`` and
    the keyword ``arguments`` the engine passed): as :func:`sglang_plugin` in a scheduler
    child, ``constructor`` checked against the release's entry first."""
    try:
        rank = {k: arguments.get(f"{k}_rank") for k in _RANKS}
        return _start("scheduler", rank, constructor)
    except Exception as exc:  # never take the actor down
        _failed(exc)
        return None


def _start(role: str, rank: dict[str, Any], actor: Any = None) -> Status:
    status = Status(os.getpid(), role, rank, False, None, logging.INFO)
    if not _asked():
        status.reason = f"{ENV_ACTIVATE}='' (set it to 1, or launch with {_LAUNCHER})"
    elif _refused_as_shadowed(status):
        pass
    else:
        _activate(status, actor)
        _settings_problems(status)
        _observe(status)
    _for_ray_actors(status)
    status.ready = True
    if status.settled:
        _finish(status)
    return status


def _for_ray_actors(status: Status) -> None:
    """A ``RayEngine``'s process: its scheduler actors start warcore-sglang themselves
    (:mod:`warcore_sglang._ray`), asked here or in their own environment; a launcher or an
    ``Engine`` that has not imported sglang's Ray actor yet wraps it when it does."""
    status.ray = _ray.wrap_scheduler_actors()
    level = logging.ERROR if _asked() else logging.WARNING
    if status.ray is None and status.role in ("launcher", "engine"):
        who = f"warcore-sglang: process {status.pid} ({status.role})"
        try:
            _ray.wrap_when_imported(lambda why: _emit(level, f"{who}: {why}"))
        except Exception as exc:  # warcore itself cannot be imported: the line says so
            if _asked():
                status.ray = f"sglang's Ray scheduler actors will not be wrapped: {_reason(exc)}"
    if status.ray is not None and status.ray != _ray.WRAPPED:
        status.level = max(status.level, level)


def _failed(exc: Exception) -> None:
    _emit(
        logging.ERROR,
        f"warcore-sglang: start-up in process {os.getpid()} failed: {type(exc).__name__}: {exc}",
    )
