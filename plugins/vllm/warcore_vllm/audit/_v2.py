"""vLLM 0.33.0's V2 staging ring on a CPU: the real ``UvaBufferPool`` (its round robin, its
depth from the real ``set_default_max_concurrency``), released by the real ``AsyncOutput``'s
``copy_event`` through a batch queue of ``max_concurrent_batches`` steps, and the encoder
runner's real ``input_tensor_semaphore``.

The pool's slots are vLLM's own CPU ``UvaBuffer`` (``vllm/v1/worker/cpu/buffer_utils.py``,
what vLLM's CPU V2 runner puts in the pool): its device view *is* the host memory, as a UVA
view is on a GPU, so each step's kernels read the slot in place until the step is done
(:meth:`~warcore_vllm.audit._device.RecordingDevice.read_in_place`). The V2 runner itself is not
built (its forward, input preparation and block tables launch Triton kernels a CPU has no
stand-in for here); a step stages one write per pool, as ``UvaBackedTensor.copy_to_uva`` and
``StagedWriteTensor.apply_write`` do once per step. The uses per step are not counted from
the V2 runner's code path (it cannot run here); read from it, each pool is used at most once
per step on the main path (see docs/vllm.md). The data-parallel configuration is a *model* of
#54269's class: a step kind that stages a pool use and returns no ``AsyncOutput``; 0.33.0's
own dummy run (``execute_model(dummy_run=True)``) skips the staging block and stages none.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ._device import RecordingDevice
from ._ring import cpu_uva

__all__ = ["V2Configuration", "async_output", "encoder_ring", "model_runner_output", "v2_ring"]


@dataclass(frozen=True)
class V2Configuration:
    name: str
    pipeline_parallel: int = 1
    dummy_runs_per_step: int = 0
    """Dummy runs an idle data-parallel rank launches between its steps (DP > 1)."""

    def describe(self) -> str:
        text = f"V2 runner, async_scheduling=True, pipeline_parallel_size={self.pipeline_parallel}"
        if self.dummy_runs_per_step:
            text += (
                f", data_parallel_size=2 (modelled: an idle rank's {self.dummy_runs_per_step} "
                "dummy run/step staging a pool use)"
            )
        return text


def max_concurrent_batches(pipeline_parallel: int) -> int:
    """``VllmConfig.max_concurrent_batches`` (the real property) for the V2 runner under async
    scheduling (on this CPU ``use_v2_model_runner`` is False: Triton is missing)."""
    from vllm.config import VllmConfig

    config = SimpleNamespace(
        parallel_config=SimpleNamespace(pipeline_parallel_size=pipeline_parallel),
        scheduler_config=SimpleNamespace(async_scheduling=True),
        use_v2_model_runner=True,
    )
    value = VllmConfig.max_concurrent_batches.fget(config)
    return int(value)


def model_runner_output(req_ids: list[str]) -> Any:
    """A ``ModelRunnerOutput`` of ``req_ids`` (0.33.0 also wants their index by id, a field
    0.34.0 removed: given where the installed class has it)."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    kwargs: dict[str, Any] = {"req_ids": req_ids}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        kwargs["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(**kwargs)


def async_output() -> Any:
    """A real ``AsyncOutput`` for a step (its inputs: one sampled token); created inside
    ``RecordingDevice.installed()``, its ``copy_event`` is recorded at the device's position."""
    from vllm.v1.worker.gpu.async_utils import AsyncOutput

    sampled = torch.zeros((1, 1), dtype=torch.int32)
    sampler_output = SimpleNamespace(
        sampled_token_ids=sampled,
        logprobs_tensors=None,
        num_nans=None,
        sampling_mask_tensors=None,
        num_rejected=torch.zeros(1, dtype=torch.int32),
    )
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    return AsyncOutput(
        model_runner_output=model_runner_output([]),
        sampler_output=sampler_output,
        num_sampled_tokens=torch.ones(1, dtype=torch.int32),
        main_stream=stream,
        copy_stream=stream,
        check_ep_fault=False,
        pending_aux_output=None,
    )


def v2_ring(cfg: V2Configuration, device: RecordingDevice, steps: int = 6) -> tuple[int, int]:
    """Serve ``steps`` engine steps through one real pool; returns (queue, depth)."""
    batches = max_concurrent_batches(cfg.pipeline_parallel)
    queue: deque[Any] = deque()
    with cpu_uva() as buffers:
        buffers.set_default_max_concurrency(batches)
        pool = buffers.UvaBufferPool(8, torch.int32)
        for step in range(steps):
            device.step = step
            for dummy in range(cfg.dummy_runs_per_step):
                view = pool.copy_to_uva([1000 * step + dummy] * 4)
                device.read_in_place("UvaBufferPool slot", view, "dummy run's kernels")
            view = pool.copy_to_uva([step] * 4)
            device.read_in_place("UvaBufferPool slot", view, "step's kernels (UVA read)")
            queue.append(async_output())
            if len(queue) >= batches:
                queue.popleft().get_output()
        while queue:
            queue.popleft().get_output()
    device.synchronize("end of the run")
    return batches, pool.max_concurrency


def encoder_ring(device: RecordingDevice, steps: int = 6, batches: int = 2) -> int:
    """The encoder-only runner's steps: each stages through a real pool of depth
    ``max_concurrent_batches`` inside the real ``MMEncoderModelRunner.input_tensor_semaphore``
    (on a bare runner holding the events its ``__init__`` makes: one blocking event per
    concurrent batch). Encoder steps return no ``AsyncOutput``: the semaphore is their only
    release. Returns the ring depth."""
    from vllm.v1.worker.mm_encoder_model_runner import MMEncoderModelRunner

    runner = object.__new__(MMEncoderModelRunner)
    runner._input_events = [torch.Event(blocking=True) for _ in range(batches)]
    runner._input_event_idx = 0
    with cpu_uva() as buffers:
        pool = buffers.UvaBufferPool(8, torch.int32, max_concurrency=batches)
        for step in range(steps):
            device.step = step
            with runner.input_tensor_semaphore():
                view = pool.copy_to_uva([step] * 4)
                device.read_in_place("UvaBufferPool slot", view, "encoder step's input kernels")
            device.mark()  # the encoder forward
    device.synchronize("end of the run")
    return int(pool.max_concurrency)
