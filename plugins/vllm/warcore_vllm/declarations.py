"""What warcore-vllm declares about vLLM, in warcore's vocabulary (pure data: importing this
imports nothing of vLLM, nor torch). Which of these each audited release has, and everything
else that differs per release, is :mod:`warcore_vllm.releases`.

Each runner's staging is said with the terms of warcore's own staging model
(:mod:`warcore.batch` ``HostStaging``, ``staging_depth``; :func:`warcore.core.host_release_point`;
the host KV tier's deferred free): whether a guard releases the staged host buffers (``guarded``,
warcore's ``staging_guard``), how deep the ring is, where the release is recorded, and until
when the device reads the host buffers (``host_reads``, a :class:`warcore.SharedReadBoundary`).
A user of V2's staging ring is a :class:`RingUser` in the same terms.
"""

from __future__ import annotations

from dataclasses import dataclass

from warcore.core import SharedReadBoundary

__all__ = ["COPY_EVENT", "DEFERRED_FREE", "STAGING", "UVA", "RingUser", "Staging"]

UVA = SharedReadBoundary.POST_REPLAY
"""A UVA slot is host memory the step's kernels read in place, through the whole forward."""

COPY_EVENT = (
    "AsyncOutput.copy_event (recorded after the step's kernels, before the drafter; the batch "
    "queue synchronizes it before step N + max_concurrent_batches is scheduled)"
)


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


@dataclass(frozen=True)
class RingUser:
    """One user of V2's ``UvaBufferPool`` staging ring, in warcore's vocabulary: depth-only
    staging (``staging_guard=False``: a slot comes back after ``max_concurrency`` uses), what it
    writes per step, until when the device reads it (``host_reads``) and what releases it."""

    name: str
    """The class, as the audit's verdict names it."""
    where: str
    """Construct / stage / apply, file:line in the release's wheel."""
    pools: str
    writes: str
    """What it writes per step (each write is one use of each pool named)."""
    release: str = COPY_EVENT
    host_reads: SharedReadBoundary = UVA
    audited: str = "runner"
    """How the audit exercises it: ``runner`` (in the V2 runner the audit builds, through
    ``execute_model``), ``check`` (a check of its own, among the release's audits), or
    ``read`` (read from the code; its classes do not build on a CPU)."""
    module: str = ""
    """Where a ``read`` user is defined."""


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
