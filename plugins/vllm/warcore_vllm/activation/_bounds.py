"""What the activation puts around vLLM's V2 code where the audit found a configuration unsound:
each wrapper runs vLLM's own function every time and only adds to it, a deeper ring or a host
wait; nothing of vLLM's guards is removed or replaced.

* **The ring's depth** (``GPUModelRunner.__init__`` and the ``set_default_max_concurrency`` its
  module binds): vLLM sizes every ``UvaBufferPool`` at ``max(2, max_concurrent_batches)``, one
  use of a slot per step. :func:`ring_depth` takes the larger of that and what the runner's
  configuration needs: uses per step (a model state's ``prepare_attn`` runs once per
  microbatch) times the steps whose reads may be in flight (``max_concurrent_batches``, and one
  more with a drafter, whose reads of the sampler's slots run after the step's release).
* **Warmups that run steps back to back** (``_warmup_kernels``; 0.33.0's mixed warmup too):
  called with ``worker_execute_model`` wrapped to synchronize the device before each step, and
  the device synchronized once more when it returns, as 0.34.0's ``_run_step`` does for its
  other warmups: no slot is reused while a discarded step may still read it.
* **A step without a forward** (``execute_model`` returning early, zero tokens scheduled): it
  may have staged writes, whose kernels read slots, and it has no release; the device is
  synchronized when it returns.
* **Dummy runs of a model state that stages in them** (DeepSeek V4.1's ``prepare_attn``): they
  have no release at all, so no depth bounds them. Every step of such a runner first waits for
  the step that last used the slots it comes round to, as vLLM's own encoder runner does
  (``MMEncoderModelRunner.input_tensor_semaphore``, #53176): an event recorded after each
  step, a ring of them as long as the steps a slot comes round in.

What warcore adds never raises into vLLM: a failure of it is told to :data:`on_failure` (the
activation takes itself off) and vLLM's own behaviour goes on. Imports nothing of vLLM, nor
torch, at import time.
"""

from __future__ import annotations

import contextvars
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from warcore.integration.patching import wrap

__all__ = [
    "RingDepth",
    "RunnerState",
    "make_execute_model",
    "make_runner_init",
    "make_set_default_max_concurrency",
    "make_synchronized_warmup",
    "ring_depth",
    "runners",
    "synchronizes",
]

BUFFERS = "vllm.v1.worker.gpu.buffer_utils"

DRAFTER = "the drafter reads sampler slots after copy_event: one more step in flight"


@dataclass(frozen=True)
class RingDepth:
    """A runner's staging ring: vLLM's depth, the one in force, and why they differ."""

    vllm: int
    depth: int
    uses_per_step: int = 1
    reasons: tuple[str, ...] = ()

    def phrase(self) -> str:
        if self.depth == self.vllm:
            return f"ring depth {self.vllm} (vLLM's: enough for this configuration)"
        return f"ring depth {self.vllm} -> {self.depth} ({'; '.join(self.reasons)})"


def ring_depth(config: Any, vllm: int) -> RingDepth:
    """What ``config`` (a ``VllmConfig``) needs of the ring, at least vLLM's own ``vllm``:
    uses per step (microbatches) times the steps whose reads may be in flight."""
    parallel = config.parallel_config
    uses = int(parallel.num_ubatches) if parallel.use_ubatching else 1
    steps = int(config.max_concurrent_batches)
    reasons = []
    if uses > 1:
        reasons.append(f"{uses} microbatches: the model state stages {uses} times a step")
    if config.speculative_config is not None:
        steps += 1
        reasons.append(DRAFTER)
    return RingDepth(vllm, max(vllm, uses * steps), uses, tuple(reasons))


@dataclass
class RunnerState:
    """What the activation knows of one V2 runner."""

    depth: RingDepth
    stager: bool | None = None
    """Its model state stages in dummy runs (decided at its first step: the state is loaded
    after ``__init__``)."""
    events: list[Any] = field(default_factory=list)
    index: int = 0


runners: weakref.WeakKeyDictionary[Any, RunnerState] = weakref.WeakKeyDictionary()
"""Each V2 runner built or stepped while the activation was installed."""
synchronizes: dict[str, int] = {}
"""Device synchronizes the wrappers added, by what they are for (counted for the tests)."""


def _ignore(what: str, exc: Exception) -> None:
    pass


on_failure: Callable[[str, Exception], None] = _ignore
"""Told when what warcore adds fails (the activation sets it: it takes itself off)."""

_building: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "warcore_vllm_building", default=None
)
"""[the runner's VllmConfig, its RingDepth once decided] while its ``__init__`` runs."""


def _safely(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``; a failure goes to :data:`on_failure`, never to vLLM (``None``)."""
    try:
        return function(*args)
    except Exception as exc:
        on_failure(what, exc)
        return None


def _synchronize(what: str) -> None:
    import torch

    torch.accelerator.synchronize()
    synchronizes[what] = synchronizes.get(what, 0) + 1


def _vllm_depth() -> RingDepth:
    depth = int(sys.modules[BUFFERS]._DEFAULT_MAX_CONCURRENCY)
    return RingDepth(depth, depth)


# -- the ring's depth ------------------------------------------------------------------------


def _decide(building: list[Any], original: Callable[[int], None]) -> None:
    decided = ring_depth(building[0], _vllm_depth().vllm)
    if decided.depth > decided.vllm:
        original(decided.depth)
    building[1:] = [decided]


def make_set_default_max_concurrency(original: Callable[[int], None]) -> Callable[[int], None]:
    """vLLM's ``set_default_max_concurrency(n)``, then, inside a runner's ``__init__``, again
    with the depth its configuration needs where that is more."""

    def set_default_max_concurrency(n: int) -> None:
        original(n)
        building = _building.get()
        if building is not None:
            _safely("ring depth", _decide, building, original)

    return wrap(set_default_max_concurrency, original)


def make_runner_init(
    original: Callable[..., None], built: Callable[[Any, RingDepth], None]
) -> Callable[..., None]:
    """vLLM's ``GPUModelRunner.__init__``, its configuration known to the ring's depth while it
    runs; ``built(runner, depth)`` is told once it returns."""

    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        building: list[Any] = [vllm_config]
        token = _building.set(building)
        try:
            original(self, vllm_config, *args, **kwargs)
        finally:
            _building.reset(token)
        depth = building[1] if len(building) > 1 else _vllm_depth()
        _safely("runner built", _built, self, depth, built)

    return wrap(__init__, original)


def _built(runner: Any, depth: RingDepth, built: Callable[[Any, RingDepth], None]) -> None:
    runners[runner] = RunnerState(depth)
    built(runner, depth)


# -- steps without a release -----------------------------------------------------------------


def _stages_in_dummy_runs(model_state: Any, stagers: tuple[str, ...]) -> bool:
    for where in stagers:
        module, _, name = where.partition(":")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(model_state, cls):
            return True
    return False


def _ring_of(runner: Any, stagers: tuple[str, ...]) -> RunnerState | None:
    """The runner's state when its model state stages in dummy runs (else ``None``)."""
    state = runners.get(runner)
    if state is None:  # built before the activation was installed: vLLM's depth
        state = runners.setdefault(runner, RunnerState(_vllm_depth()))
    if state.stager is None:
        state.stager = _stages_in_dummy_runs(getattr(runner, "model_state", None), stagers)
    return state if state.stager else None


def _wait_for_slots(state: RunnerState) -> None:
    """Before a step: the step that used the slots this one comes round to is done."""
    import torch

    if not state.events:  # one event per step a slot of each pool comes round in
        steps = max(1, state.depth.depth // state.depth.uses_per_step)
        state.events = [torch.Event(blocking=True) for _ in range(steps)]
    state.events[state.index].synchronize()


def _released(state: RunnerState) -> None:
    """After a step: its event recorded (behind everything the step launched)."""
    state.events[state.index].record()
    state.index = (state.index + 1) % len(state.events)


def make_execute_model(
    original: Callable[..., Any], stagers: tuple[str, ...]
) -> Callable[..., Any]:
    """vLLM's ``execute_model``: a runner whose model state stages in dummy runs (``stagers``,
    ``module:Class``) takes each step through its event ring; a step that schedules no tokens
    (no forward, no release) is followed by a device synchronize."""

    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        dummy_run = bool(args[1] if len(args) > 1 else kwargs.get("dummy_run", False))
        ring = _safely("the event ring", _ring_of, self, stagers)
        if ring is not None:
            _safely("the event ring", _wait_for_slots, ring)
        try:
            output = original(self, scheduler_output, *args, **kwargs)
        finally:
            if ring is not None and ring.events:
                _safely("the event ring", _released, ring)
        if not dummy_run and scheduler_output.total_num_scheduled_tokens == 0:
            _safely("a zero-token step", _synchronize, "a zero-token step")
        return output

    return wrap(execute_model, original)


# -- warmups -----------------------------------------------------------------------------------


def make_synchronized_warmup(original: Callable[..., Any]) -> Callable[..., Any]:
    """A warmup function of vLLM's, each of its steps after the device finished the previous
    one, and the device finished with its last when it returns."""
    name = str(getattr(original, "__name__", "warmup"))

    def warmup(
        model_runner: Any,
        worker_execute_model: Callable[[Any], Any],
        worker_sample_tokens: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        def execute(scheduler_output: Any) -> Any:
            _safely(name, _synchronize, name)
            return worker_execute_model(scheduler_output)

        result = original(model_runner, execute, worker_sample_tokens, *args, **kwargs)
        _safely(name, _synchronize, name)
        return result

    return wrap(warmup, original)
