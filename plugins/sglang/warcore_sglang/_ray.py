"""sglang on Ray: each scheduler of a ``RayEngine`` is a Ray actor (``SchedulerActor``), and
warcore activates in each, without user code.

sglang's ``RayEngine`` loads plugins in its own process (``Engine.__init__`` calls
``load_plugins()``), but its ``SchedulerActor.__init__`` builds the ``Scheduler`` without
calling ``load_plugins()``: warcore-sglang's entry point never runs in the actor. So the entry
point, in the engine's process, wraps the constructor of the class Ray ships to the actors
(:func:`wrap_scheduler_actors`, whenever ``sglang.srt.ray.scheduler_actor`` is imported
there, or :func:`wrap_when_imported` where it is imported later): the wrapper runs first thing
in each actor, before ``Scheduler`` is built, and starts
warcore-sglang there (:func:`warcore_sglang._entry.scheduler_actor`) as ``load_plugins()``
would, then calls sglang's constructor with the arguments as given. Each actor says its own
start-up line (Ray shows it in the driver's output), once its ``Scheduler`` is built: active,
with the ranks sglang published for it, or not and why; never silent.

Why the constructor and not a Ray ``runtime_env``: Ray honours ``worker_process_setup_hook``
only in the job's ``runtime_env`` (``ray.init``), not in an actor's (ray 2.60:
``upload_worker_process_setup_hook_if_needed`` runs for the job only), which belongs to the
user; and a hook that cannot be imported on a node makes Ray end the worker, taking the engine
down. Ray pickles the actor class by value (cloudpickle: the module's ``SchedulerActor`` is
Ray's ``ActorClass``, not the class), so the wrapper, a closure that refers to no module of
its own, reaches every actor of the job, on every node, and unpickles where warcore-sglang is
not installed (it then says so in the actor's line).

The engine's ``WARCORE_*`` variables travel with the wrapper: each actor takes those its own
environment does not set (a Ray node's raylet, not the driver, is the parent of its workers).

Standard library only at import: the engine's process pays a class attribute (a launcher
that has not imported sglang's Ray modules yet, an import hook).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "ACTOR_INIT",
    "ACTOR_MODULE",
    "WRAPPED",
    "unaudited",
    "wrap_scheduler_actors",
    "wrap_when_imported",
]

ACTOR_MODULE = "sglang.srt.ray.scheduler_actor"
ACTOR_INIT = "SchedulerActor.__init__"
FORWARDED = "WARCORE_"
"""The prefix of the engine's variables each actor takes where its own environment has none
(``WARCORE_SGLANG*``, and the core's ``WARCORE_PLUGINS``, ``WARCORE_DISABLE_PLUGINS``)."""
_MARK = "__warcore_sglang_actor__"
WRAPPED = "each Ray SchedulerActor runs warcore-sglang's entry point before its Scheduler is built"
"""What the engine's start-up line says once the actors' constructor is wrapped."""


def _actor_class(actor: Any) -> type | None:
    """The class Ray builds each actor from (``ActorClass.__ray_metadata__.modified_class``,
    ray 2.x), or ``None``."""
    metadata = getattr(actor, "__ray_metadata__", None)
    cls = getattr(metadata, "modified_class", None)
    return cls if isinstance(cls, type) else None


def wrap_scheduler_actors() -> str | None:
    """In a process that imported sglang's Ray scheduler actor (a ``RayEngine``'s): wrap its
    constructor (idempotent). Returns what the start-up line of this process says of it (the
    actors activate, or why they cannot), ``None`` where sglang's Ray actor is not imported."""
    module = sys.modules.get(ACTOR_MODULE)
    if module is None:
        return None
    cls = _actor_class(getattr(module, "SchedulerActor", None))
    if cls is None:
        return (
            f"Ray's actor class is not found behind {ACTOR_MODULE}.SchedulerActor "
            "(__ray_metadata__.modified_class): warcore cannot activate in the scheduler actors"
        )
    actor: Any = cls  # its constructor is replaced on the class
    if not getattr(actor.__init__, _MARK, False):
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
        actor.__init__ = _actor_init(actor.__init__, forwarded)
    return WRAPPED


def wrap_when_imported(on_failure: Callable[[str], None]) -> None:
    """sglang's Ray actor module is not imported yet in this process (``python -m
    sglang.launch_server --use-ray`` loads plugins at module level, and imports its Ray
    launcher later): wrap the constructor right after it is imported; ``on_failure`` says why
    not, if it cannot be wrapped then."""
    from warcore.integration.post_import import PostImportFinder

    def wrap(module: Any) -> None:
        try:
            said = wrap_scheduler_actors()
        except Exception as exc:  # an import hook must not raise into sglang's import
            said = f"{type(exc).__name__}: {exc}"
        if said != WRAPPED:
            on_failure(str(said))

    sys.meta_path.insert(0, PostImportFinder({ACTOR_MODULE: wrap}))


def _actor_init(original: Callable[..., None], forwarded: dict[str, str]) -> Callable[..., None]:
    """The wrapped constructor. It refers to nothing of this module (it is pickled by value
    into every actor, where warcore-sglang may be missing): ``os``, ``sys`` and the
    entry point are imported inside."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        import os
        import sys

        for name, value in forwarded.items():
            os.environ.setdefault(name, value)
        try:
            from warcore_sglang._entry import scheduler_actor
        except Exception as exc:  # never take the actor down
            print(
                f"[ERROR] warcore-sglang: process {os.getpid()} (scheduler actor): warcore NOT "
                f"active: warcore_sglang cannot be imported here: {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
        else:
            scheduler_actor(original, kwargs)
        original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    __init__.__warcore_original__ = original  # type: ignore[attr-defined]
    return __init__


def unaudited(constructor: Callable[..., Any]) -> str | None:
    """Why sglang's ``SchedulerActor.__init__`` (the one this actor runs) is not the code the
    installed release's entry audited (row ``sglang.srt.ray.scheduler_actor`` /
    ``SchedulerActor.__init__``); ``None`` when it is, or when the release is not audited at
    all (the activation refuses it, in its own words). The digest alone is compared: it covers
    the parameters as written, and the live signature is Ray's (its tracing support sets
    ``__signature__`` on every actor method, adding ``_ray_trace_ctx``)."""
    from warcore.integration import engine_code

    from .declarations import oracle
    from .releases import RELEASES

    version = oracle.installed_version()
    release = RELEASES.get(version or "")
    if release is None:
        return None
    _, digest = release.functions_of(ACTOR_MODULE).get(ACTOR_INIT, ("", ""))
    if not digest:
        return f"{ACTOR_MODULE}.{ACTOR_INIT} is not audited for sglang {version}"
    found = engine_code.digest(constructor)
    if found != digest:
        return (
            f"code of {ACTOR_INIT}: differs from the audited {version} (digest {found}, "
            f"audited {digest})"
        )
    return None
