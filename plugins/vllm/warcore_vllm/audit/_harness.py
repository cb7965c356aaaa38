"""vLLM's real objects, built and driven on a CPU: the configuration, the V1 runner (0.33.0),
the scheduler, and the engine's overlap loop.

Built from vLLM's own constructors (``ModelConfig`` from a ``config.json``-only tiny Llama,
``VllmConfig``, ``GPUModelRunner(vllm_config, cpu)``, ``Scheduler`` / ``AsyncScheduler``), inside
a one-process gloo world. Two settings are made after ``VllmConfig`` is built, because vLLM's
CPU platform overrides them ("async scheduling is not required on CPU"): the scheduler's
``async_scheduling`` and the pipeline-parallel size, each set to the configuration audited
(the runner and ``VllmConfig.max_concurrent_batches`` read them from there).

The loop is the shape of ``EngineCore.step_with_batch_queue`` with a queue of
``max_concurrent_batches`` steps: schedule and stage step N+1, launch it, and only then wait
for the oldest step's output and give it to ``Scheduler.update_from_output``. A step's staging
is what ``GPUModelRunner.execute_model`` runs inside its guard: the real
``synchronize_input_prep``, ``_update_states`` and ``_prepare_inputs`` (the forward is not run:
the 0.33.0 wheel has no CPU kernels). ``BlockTable``'s Triton slot-mapping kernel is the one
kernel of that path a CPU cannot run; :func:`slot_mapping_standin` computes the same in torch.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import socket
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._device import RecordingDevice

__all__ = ["Configuration", "V1Run", "build_v1", "run_v1", "vllm_config"]

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

BLOCK = 16
VOCAB = 256


@dataclass(frozen=True)
class Configuration:
    """One vLLM configuration the audit names."""

    name: str
    async_scheduling: bool
    pipeline_parallel: int = 1
    kv_consumer: bool = False
    sliding_window: int | None = None

    def describe(self) -> str:
        parts = [f"async_scheduling={self.async_scheduling}"]
        parts.append(f"pipeline_parallel_size={self.pipeline_parallel}")
        if self.kv_consumer:
            parts.append("kv_role=kv_consumer")
        if self.sliding_window:
            parts.append(f"sliding_window={self.sliding_window}")
        return ", ".join(parts)


DEFAULT = Configuration("default (async scheduling)", async_scheduling=True)
PP_NO_ASYNC = Configuration("#47644 (pipeline parallel, no async)", False, pipeline_parallel=2)
SYNC = Configuration("synchronous", async_scheduling=False)


@functools.cache
def tiny_model(sliding_window: int | None = None) -> Path:
    """A ``config.json``-only Llama (no weights: nothing here loads them), one folder per
    process and window."""
    folder = Path(tempfile.mkdtemp(prefix="warcore-vllm-model-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    config: dict[str, Any] = {
        "architectures": ["MistralForCausalLM" if sliding_window else "LlamaForCausalLM"],
        "model_type": "mistral" if sliding_window else "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }
    if sliding_window:
        config["sliding_window"] = sliding_window
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def vllm_config(cfg: Configuration, *, num_blocks: int = 32) -> Any:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    model = ModelConfig(
        model=str(tiny_model(sliding_window=cfg.sliding_window)),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
    )
    scheduler = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256, is_encoder_decoder=False
    )
    kwargs: dict[str, Any] = {}
    if cfg.kv_consumer:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_consumer",
            kv_connector_extra_config={"shared_storage_path": tempfile.mkdtemp()},
        )
    with triton_refusal_passed():
        vc = VllmConfig(
            model_config=model,
            scheduler_config=scheduler,
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
            **kwargs,
        )
    vc.scheduler_config.async_scheduling = cfg.async_scheduling
    vc.parallel_config.pipeline_parallel_size = cfg.pipeline_parallel
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc


@contextlib.contextmanager
def triton_refusal_passed() -> Iterator[None]:
    """``VllmConfig`` built past the CPU platform's refusal of x86 without Triton, where the
    installed release refuses (:attr:`warcore_vllm.releases.VllmRelease.refuses_x86_without_triton`,
    0.34.0's ``platforms/cpu.py:242-243``): ``HAS_TRITON`` reads True while
    ``CpuPlatform.check_and_update_config`` runs, and only then. A stand-in: triton-cpu is not
    on this machine's package index, and nothing the audit runs launches a Triton kernel."""
    from ..gate import current

    if not current().refuses_x86_without_triton:
        yield
        return
    import vllm.triton_utils as triton_utils
    from vllm.platforms.cpu import CpuPlatform

    original = vars(CpuPlatform)["check_and_update_config"]

    def checked(cls: type, vllm_config: Any) -> None:
        saved, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            original.__func__(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    CpuPlatform.check_and_update_config = classmethod(checked)
    try:
        yield
    finally:
        CpuPlatform.check_and_update_config = original


_WORLD = False


def preload() -> None:
    """Import what the harness uses for the installed release
    (:attr:`warcore_vllm.releases.VllmRelease.preload`), before the recording device is installed
    (torch's own lazy imports subclass ``torch.Event``; they must see the real one)."""
    import importlib

    from ..gate import current

    for name in current().preload:
        importlib.import_module(name)


def one_process_world(vc: Any) -> None:
    """vLLM's distributed state for one process (gloo), once per process."""
    global _WORLD
    if _WORLD:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
    _WORLD = True


def slot_mapping_standin(
    num_reqs: int,
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    block_table_stride: int,
    slot_mapping: torch.Tensor,
    kv_cache_block_size: int,
    total_cp_world_size: int,
    total_cp_rank: int,
    cp_kv_cache_interleave_size: int,
) -> None:
    """``ComputeSlotMappingKernel`` (vllm/v1/worker/block_table.py) in torch, without context
    parallelism: each token's slot is its block's number times the block size plus its offset;
    the tail up to ``max_num_tokens`` is padded with ``PAD_SLOT_ID``."""
    from vllm.v1.worker.block_table import PAD_SLOT_ID

    if total_cp_world_size != 1:
        raise NotImplementedError("the slot-mapping stand-in has no context parallelism")
    starts = query_start_loc[: num_reqs + 1].tolist()
    for req in range(num_reqs):
        pos = positions[starts[req] : starts[req + 1]].to(torch.int64)
        blocks = block_table[req, pos // kv_cache_block_size].to(torch.int64)
        slot_mapping[starts[req] : starts[req + 1]] = blocks * kv_cache_block_size + (
            pos % kv_cache_block_size
        )
    slot_mapping[num_tokens:max_num_tokens] = PAD_SLOT_ID


@contextlib.contextmanager
def kernel_standins() -> Iterator[None]:
    import vllm.v1.worker.block_table as block_table

    saved = block_table._COMPUTE_SLOT_MAPPING_KERNEL
    block_table._COMPUTE_SLOT_MAPPING_KERNEL = slot_mapping_standin
    try:
        yield
    finally:
        block_table._COMPUTE_SLOT_MAPPING_KERNEL = saved


def build_v1(cfg: Configuration, device: RecordingDevice) -> tuple[Any, Any]:
    """The real V1 ``GPUModelRunner`` (on the CPU device) and its ``VllmConfig``, built with the
    recording device installed (its events are the runner's)."""
    from vllm.config import set_current_vllm_config

    vc = vllm_config(cfg)
    one_process_world(vc)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    with set_current_vllm_config(vc):
        runner = GPUModelRunner(vc, torch.device("cpu"))
    register_v1_buffers(runner, device)
    return runner, vc


def register_v1_buffers(runner: Any, device: RecordingDevice) -> None:
    """Every persistent host buffer a V1 runner stages through: its ``CpuGpuBuffer``s, the
    ``InputBatch``'s pinned tensors and the block tables' buffers."""
    from vllm.v1.utils import CpuGpuBuffer

    def walk(owner: str, obj: Any) -> None:
        for name, value in vars(obj).items():
            if isinstance(value, CpuGpuBuffer):
                device.register(f"{owner}.{name}.cpu", value.cpu)
            elif isinstance(value, torch.Tensor) and name.endswith("_cpu_tensor"):
                device.register(f"{owner}.{name}", value)

    walk("GPUModelRunner", runner)
    walk("InputBatch", runner.input_batch)
    for i, table in enumerate(runner.input_batch.block_table.block_tables):
        walk(f"BlockTable[{i}]", table)


@dataclass
class V1Run:
    runner: Any
    config: Any
    device: RecordingDevice
    steps: int = 0


def kv_cache_config(vc: Any, num_blocks: int = 32) -> Any:
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    window = vc.model_config.get_sliding_window()
    common = {"block_size": BLOCK, "num_kv_heads": 2, "head_size": 64, "dtype": torch.float32}
    spec = (
        SlidingWindowSpec(sliding_window=window, **common)
        if window
        else FullAttentionSpec(**common)
    )
    group = KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])


def scheduler(vc: Any, num_blocks: int = 32) -> Any:
    """The real scheduler vLLM's engine core builds for ``vc``: ``AsyncScheduler`` under async
    scheduling, else ``Scheduler``."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cls = AsyncScheduler if vc.scheduler_config.async_scheduling else Scheduler
    return cls(vc, kv_cache_config(vc, num_blocks), StructuredOutputManager(vc), block_size=BLOCK)


def add_requests(sched: Any, count: int, prompt: int, max_tokens: int, first: int = 0) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    for i in range(first, first + count):
        ids = [(7 * i + j) % VOCAB for j in range(prompt + i)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        sched.add_request(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=ids,
                sampling_params=params,
                pooling_params=None,
            )
        )


def model_output(so: Any) -> Any:
    """What the runner would return for step ``so``: one token per scheduled request (a
    function of the request and its position, so every run agrees)."""
    from ._v2 import model_runner_output

    req_ids = sorted(so.num_scheduled_tokens)
    output = model_runner_output(req_ids)
    output.sampled_token_ids = [[(hash(r) + so.num_scheduled_tokens[r]) % VOCAB] for r in req_ids]
    return output


def stage(run: V1Run, so: Any) -> None:
    """What ``GPUModelRunner.execute_model`` runs inside its guard (0.33.0, lines 3940-4133),
    for a step without multimodal inputs, spec decode or mamba."""
    import numpy as np

    runner = run.runner
    with runner.synchronize_input_prep():
        runner._update_states(so)
        if so.total_num_scheduled_tokens:
            tokens = [so.num_scheduled_tokens[r] for r in runner.input_batch.req_ids]
            runner._prepare_inputs(so, np.array(tokens, dtype=np.int32))


def run_v1(run: V1Run, steps: int = 6, requests: int = 3) -> V1Run:
    """Serve ``requests`` for ``steps`` engine steps with the batch-queue loop."""
    device, vc = run.device, run.config
    sched = scheduler(vc)
    run.runner.kv_cache_config = kv_cache_config(vc)
    add_requests(sched, requests, prompt=9, max_tokens=steps)
    depth = vc.max_concurrent_batches
    queue: deque[tuple[Any, int]] = deque()
    with kernel_standins():
        for step in range(steps):
            device.step = step
            so = sched.schedule()
            stage(run, so)
            run.steps += 1
            queue.append((so, device.mark()))
            if len(queue) >= depth:
                _collect(device, sched, *queue.popleft())
        while queue:
            _collect(device, sched, *queue.popleft())
    device.synchronize("end of the run")
    return run


def _collect(device: RecordingDevice, sched: Any, so: Any, end: int) -> None:
    """The engine waits for a step's output: everything up to the end of its forward is done
    (the sampled tokens' device-to-host copy is ordered after it), then the scheduler takes
    the output."""
    device.complete(end, "the step's output (batch queue)")
    sched.update_from_output(so, model_output(so))
