"""What warcore-vllm declares about vLLM 0.33.0, in warcore's vocabulary, and what it relies on
(pure data: importing this imports nothing of vLLM, nor torch).

Each runner's staging is said with the terms of warcore's own staging model
(:mod:`warcore.batch` ``HostStaging``, ``staging_depth``; :func:`warcore.core.host_release_point`;
the host KV tier's deferred free): whether a guard releases the staged host buffers (``guarded``,
warcore's ``staging_guard``), how deep the ring is, where the release is recorded, and until
when the device reads the host buffers (``host_reads``, a :class:`warcore.SharedReadBoundary`).
"""

from __future__ import annotations

from dataclasses import dataclass

from warcore.core import SharedReadBoundary

__all__ = ["AUDITED", "DEFERRED_FREE", "RELIES_ON", "STAGING", "SUPPORTED", "Staging"]

SUPPORTED = "0.33.0"
"""The one vLLM release whose code the declarations were read from: compared as a string,
exactly (``packaging``'s ``==0.33.0`` would also match ``0.33.0+cpu`` and other local builds)."""


@dataclass(frozen=True)
class Staging:
    """One vLLM runner's host staging, in warcore's vocabulary."""

    runner: str
    guarded: bool
    """warcore's ``staging_guard``: an event releases the staged buffers before reuse."""
    depth: str
    """Sets of staged host buffers (warcore's ring depth), as vLLM sizes it."""
    release: str
    """What releases a step's staged buffers, and where it is recorded."""
    host_reads: SharedReadBoundary
    """Until when the device reads the staged host buffers: ``PRE_REPLAY`` for copies
    enqueued during input preparation (before the forward), ``POST_REPLAY`` for kernels that
    read host memory in place through the forward."""


STAGING: dict[str, Staging] = {
    "v1": Staging(
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
        guarded=True,
        depth="1 (one set of persistent pinned CpuGpuBuffer / InputBatch tensors)",
        release=(
            "prepare_inputs_event: recorded at the end of input preparation (after the last "
            "host-to-device enqueue, before the forward), synchronized before the next step's "
            "first host write (synchronize_input_prep); created only under async scheduling"
        ),
        host_reads=SharedReadBoundary.PRE_REPLAY,
    ),
    "v2": Staging(
        "vllm.v1.worker.gpu.model_runner.GPUModelRunner",
        guarded=False,
        depth="buffer_utils._DEFAULT_MAX_CONCURRENCY = max(2, max_concurrent_batches)",
        release=(
            "depth only: a slot comes back after max_concurrency uses; a step is done when the "
            "engine's batch queue takes its AsyncOutput (copy_event, recorded on the output "
            "copy stream after the whole forward)"
        ),
        host_reads=SharedReadBoundary.POST_REPLAY,
    ),
    "encoder": Staging(
        "vllm.v1.worker.mm_encoder_model_runner.MMEncoderModelRunner",
        guarded=True,
        depth="max_concurrent_batches (one blocking event per slot)",
        release=(
            "input_tensor_semaphore: the slot's event is synchronized on entry and recorded on "
            "exit, after input preparation"
        ),
        host_reads=SharedReadBoundary.PRE_REPLAY,
    ),
}

DEFERRED_FREE = (
    "Scheduler.defer_block_free when max_concurrent_batches > 1 and the KV connector is a "
    "consumer: a freed request's blocks return to the pool at update_from_output of the last "
    "step that scheduled it (warcore's deferred-free rule: no reuse before the last in-flight "
    "toucher is done); sliding-window blocks are freed on the settled basis "
    "num_computed_tokens - num_in_flight_tokens"
)

RELIES_ON: tuple[tuple[str, str], ...] = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.synchronize_input_prep"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sync_device"),
    ("vllm.v1.utils", "CpuGpuBuffer.copy_to_gpu"),
    ("vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
    ("vllm.v1.worker.gpu.buffer_utils", "set_default_max_concurrency"),
    ("vllm.v1.worker.gpu.buffer_utils", "UvaBufferPool.copy_to_uva"),
    ("vllm.v1.worker.mm_encoder_model_runner", "MMEncoderModelRunner.input_tensor_semaphore"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._request_blocks_can_be_freed"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._free_request_blocks"),
    ("vllm.v1.core.sched.scheduler", "Scheduler._drain_deferred_frees"),
)
"""(module, qualified name) of every vLLM function whose body the declarations, the audit and
the activation rely on: each one's AST digest must match :data:`AUDITED`."""

AUDITED: dict[str, dict[str, str]] = {
    "0.33.0": {
        "GPUModelRunner.synchronize_input_prep": "601bdf234e92daa2",
        "GPUModelRunner._sync_device": "7d4481727782412a",
        "CpuGpuBuffer.copy_to_gpu": "562e694b15ee2550",
        "VllmConfig.max_concurrent_batches": "938ae18792d87327",
        "set_default_max_concurrency": "a8782666d2748ffd",
        "UvaBufferPool.copy_to_uva": "f9bfd6d3bfdf37d9",
        "MMEncoderModelRunner.input_tensor_semaphore": "33eebf202ad327d9",
        "Scheduler._request_blocks_can_be_freed": "d8ac449f3728b2da",
        "Scheduler._free_request_blocks": "f0545679c9a18dd1",
        "Scheduler._drain_deferred_frees": "18e11b0ece4cb675",
    },
}
"""vLLM version -> qualified name -> the AST digest of its body (comments and formatting
ignored), recomputed from the installed wheel by the tests."""
