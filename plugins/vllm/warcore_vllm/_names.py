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

__all__ = ["AUDITED", "DEFERRED_FREE", "STAGING", "SUPPORTED", "Staging"]

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

AUDITED: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "0.33.0": {
        "vllm.v1.worker.gpu_model_runner": {
            "GPUModelRunner.synchronize_input_prep": ("(self)", "cf7bda73c41a9305"),
            "GPUModelRunner._sync_device": ("(self)", "59100b02856c8fb1"),
        },
        "vllm.v1.utils": {"CpuGpuBuffer.copy_to_gpu": ("(self, n=None)", "21666c0293e4e70d")},
        "vllm.config.vllm": {"VllmConfig.max_concurrent_batches": ("(self)", "9814340d4d14d561")},
        "vllm.v1.worker.gpu.buffer_utils": {
            "set_default_max_concurrency": ("(n)", "d539619bf6b8545d"),
            "UvaBufferPool.copy_to_uva": ("(self, x)", "71c256b12faa42b0"),
        },
        "vllm.v1.worker.mm_encoder_model_runner": {
            "MMEncoderModelRunner.input_tensor_semaphore": ("(self)", "b388a52d5bdfe6dd"),
        },
        "vllm.v1.core.sched.scheduler": {
            "Scheduler._request_blocks_can_be_freed": ("(self, request)", "5322eb31a21b5dfc"),
            "Scheduler._free_request_blocks": ("(self, request)", "aeaf39576c8a133f"),
            "Scheduler._drain_deferred_frees": ("(self)", "271a3d54b56d58c9"),
        },
    },
}
"""vLLM version -> module -> qualified name -> (signature, digest) of every vLLM function the
declarations, the audit and the activation rely on (:func:`warcore.audit.engine_code.digest`:
the function's own definition, docstring, comments and formatting left out, the same on every
Python version), recomputed from the installed wheel's source files by the tests."""
