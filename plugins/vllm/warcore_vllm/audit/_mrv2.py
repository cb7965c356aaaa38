"""vLLM's V2 model runner on a CPU, built by its own ``__init__`` and driven through its own
``execute_model``, ``_dummy_run`` and the real ``AsyncOutput`` release, under the ring ledger
(:mod:`warcore_vllm.audit._ring`).

**What is vLLM's.** ``vllm.v1.worker.gpu.model_runner.GPUModelRunner(vllm_config, cpu)``; what
its ``load_model`` and ``initialize_kv_cache`` build around a model, with vLLM's own
constructors (``init_model_state``, ``Sampler`` or ``GPUWatermarkSampler``,
``build_custom_logits_processors``, ``PromptLogprobsWorker``, ``BlockTables``,
``ModelCudaGraphManager`` in eager mode); every step's staging: ``execute_model`` runs as
shipped (``finish_requests``, ``add_requests``, ``update_requests``,
``block_tables.apply_staged_writes``, its zero-token return), a dummy run is the real
``_dummy_run`` through to the model, and a step is released by a real ``AsyncOutput``
(``copy_event`` recorded, ``get_output`` synchronizing it) taken by a batch queue of
``max_concurrent_batches`` steps, as ``EngineCore.step_with_batch_queue`` does.

**What stands in, and why** (named, each only for what a CPU cannot run):

* the model (:class:`StandinModel`): no weights, no kernels; its forward is where a step's
  forward is launched (the ledger marks the slots it reads), and it answers what a model
  state asks of a model (M-RoPE positions: a text-only prompt's, the same on every channel);
* ``GPUModelRunner.prepare_inputs`` of a step with tokens (:class:`ForwardReached`): from there
  on, input preparation launches Triton kernels (block-table gathers, slot mappings, positions)
  a CPU has no stand-in for here, so the forward is taken as launched at that call;
* the CPU platform's refusal of x86 without Triton (0.34.0, ``platforms/cpu.py:242-243``),
  passed while ``VllmConfig`` is built (:func:`warcore_vllm.audit._harness.vllm_config`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from . import _harness
from ._device import RecordingDevice
from ._ring import RingLedger

__all__ = ["Shape", "StandinModel", "V2", "build", "serve"]

HIDDEN = 128
DEEPSEEK_STATE = "vllm.models.deepseek_v41.nvidia.model_state"


class ForwardReached(Exception):
    """A step with tokens reached ``prepare_inputs``: its forward is launched from here."""


@dataclass(frozen=True)
class Shape:
    """One runner the audit builds: its configuration and which optional ring users it has."""

    name: str
    async_scheduling: bool = True
    pipeline_parallel: int = 1
    kv_groups: int = 1
    every_user: bool = False
    """The sampler with watermarking, trace replay and the release's custom logits processors;
    the model state with M-RoPE and prompt embeddings: every ring user a runner can hold."""
    model_state: str | None = None
    """``"deepseek_v41"``: the DeepSeek V4.1 model state (its replay window on)."""
    uva: bool = True
    """False: every slot a ``NonUvaBuffer``, as under Confidential Computing."""
    custom_logits_processors: tuple[str, ...] = ()
    speculative_tokens: int = 0
    """Above 0: speculative decoding with EAGLE proposing that many tokens, the tiny model as
    its own draft (vLLM's ``SpeculativeConfig``; the runner builds its real speculator)."""
    microbatches: int = 1
    """2: dual-batch overlap (``enable_dbo``), each step's attention prepared per microbatch."""


class StandinModel(torch.nn.Module):
    """The model (see the module docstring): its forward marks the step's slot reads."""

    def __init__(self, ledger: RingLedger, state_cls: type | None = None) -> None:
        super().__init__()
        self.ledger = ledger
        self.token_lookback_depth = 0  # what DeepSeek V4.1's state asks: no engram window
        if state_cls is not None:
            self.get_model_state_cls = lambda: state_cls

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        self.ledger.forward("the forward")
        tokens = positions.shape[-1] if positions is not None else input_ids.shape[0]
        return torch.zeros(tokens, HIDDEN)

    def get_mrope_input_positions(self, token_ids: list[int], mm_features: Any) -> Any:
        count = len(token_ids)
        return torch.arange(count, dtype=torch.int64).expand(3, count).clone(), 0


@dataclass
class V2:
    """A built runner and what the harness drives it with."""

    runner: Any
    config: Any
    device: RecordingDevice
    ledger: RingLedger
    step: int = 0
    queue: deque[Any] = field(default_factory=deque)
    drafter: Callable[[V2], None] | None = None
    """The drafter's reads of the ring (:mod:`warcore_vllm.audit._drafter`), run where
    ``sample_tokens`` runs the speculator: after the step's release is recorded, or before."""
    drafter_after_release: bool = True
    after_inputs: Callable[[V2], None] | None = None
    """More of the step's host work before its forward (a model state's per-microbatch
    ``prepare_attn``)."""

    @property
    def batches(self) -> int:
        return int(self.config.max_concurrent_batches)


def _accepted(func: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``func`` takes (a constructor's parameters differ by release)."""
    params = inspect.signature(func).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _config(shape: Shape) -> Any:
    cfg = _harness.Configuration(
        shape.name, shape.async_scheduling, pipeline_parallel=shape.pipeline_parallel
    )
    vc = _harness.vllm_config(cfg, num_blocks=64)
    if shape.speculative_tokens:
        vc.speculative_config = _eagle(vc, shape.speculative_tokens)
    if shape.microbatches > 1:  # what --enable-dbo sets (two microbatches)
        vc.parallel_config.enable_dbo = True
    return vc


def _eagle(vc: Any, tokens: int) -> Any:
    from vllm.config import SpeculativeConfig

    with _harness.triton_refusal_passed():
        return SpeculativeConfig(
            target_model_config=vc.model_config,
            target_parallel_config=vc.parallel_config,
            method="eagle",
            model=str(_harness.tiny_model()),
            num_speculative_tokens=tokens,
        )


def _sampler(runner: Any, shape: Shape) -> Any:
    """The sampler ``load_model`` builds (``model_runner.py``, "Initialize samplers")."""
    from vllm.v1.worker.gpu.sample.logits_processor.loader import build_custom_logits_processors
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    vc = runner.vllm_config
    processors = build_custom_logits_processors(
        vc, runner.req_states, False, list(shape.custom_logits_processors)
    )
    kwargs = {
        "vllm_config": vc,
        "max_num_reqs": runner.max_num_reqs,
        "vocab_size": runner.vocab_size,
        "device": runner.device,
        "req_states": runner.req_states,
        "num_speculative_tokens": runner.decode_query_len,
        "enable_trace_replay": shape.every_user,
        "custom_logits_processors": processors,
    }
    if not shape.every_user:
        return Sampler(**_accepted(Sampler.__init__, kwargs))
    from vllm.config.watermarking import WatermarkConfig
    from vllm.v1.watermarking.factory import create_watermarker
    from vllm.v1.watermarking.gpu_sampler import GPUWatermarkSampler

    watermarker = create_watermarker(WatermarkConfig(key=1))
    sampler = GPUWatermarkSampler(watermarker, **_accepted(Sampler.__init__, kwargs))
    _thinking_budget(sampler, runner)
    return sampler


def _thinking_budget(sampler: Any, runner: Any) -> None:
    """The sampler's thinking-budget state as a reasoning model's config builds it (the three
    token-id lists a reasoning parser sets; the tiny model has no parser)."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.sample.thinking_budget import ThinkingBudgetState

    ids = SimpleNamespace(
        reasoning_start_token_ids=[250],
        reasoning_end_token_ids=[251],
        natural_reasoning_end_token_ids=[252],
    )
    sampler.thinking_budget_state = ThinkingBudgetState(runner.req_states, ids)


def _every_state(runner: Any) -> None:
    """M-RoPE positions and prompt embeddings on the default model state, as
    ``DefaultModelState.__init__`` builds them for such a model."""
    from vllm.v1.worker.gpu.mm.rope import RopeState
    from vllm.v1.worker.gpu.model_states.prompt_embeds import PromptEmbedsState

    state = runner.model_state
    state.rope_state = RopeState(
        3, runner.max_num_reqs, runner.max_num_tokens, runner.max_model_len, runner.device
    )
    state.prompt_embeds_state = PromptEmbedsState(
        runner.max_num_reqs, HIDDEN, torch.float32, runner.device
    )


def _load(runner: Any, shape: Shape) -> None:
    """What ``load_model`` builds around the model."""
    from vllm.v1.worker.gpu.model_states import init_model_state
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    runner.model_state = init_model_state(
        runner.vllm_config, runner.model, runner.encoder_cache, runner.device
    )
    if shape.every_user:
        _every_state(runner)
    runner.decode_query_len = (
        runner.num_speculative_steps + runner.model_state.num_new_sampled_tokens_per_step
    )
    runner.sampler = _sampler(runner, shape)
    runner.prompt_logprobs_worker = PromptLogprobsWorker(runner.max_num_reqs, runner.device)


def _kv_init(runner: Any, shape: Shape) -> None:
    """What ``initialize_kv_cache`` builds: the KV cache config, the block tables (one per KV
    cache group) and the CUDA-graph manager, eager."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.block_table import BlockTables
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    vc = runner.vllm_config
    runner.kv_cache_config = _harness.kv_cache_config(vc, num_blocks=64)
    blocks = -(-runner.max_model_len // _harness.BLOCK)
    runner.block_tables = BlockTables(
        **_accepted(
            BlockTables.__init__,
            {
                "block_sizes": [_harness.BLOCK] * shape.kv_groups,
                "max_num_reqs": runner.max_num_reqs,
                "max_num_batched_tokens": runner.max_num_tokens,
                "max_num_blocks_per_group": [blocks] * shape.kv_groups,
                "device": runner.device,
            },
        )
    )
    runner.attn_groups = [[] for _ in range(shape.kv_groups)]
    kwargs = {
        "decode_query_len": runner.decode_query_len,
        "lora_capture_cases": runner.lora_capture_cases,
        "varlen_decode": False,
        "ubatch_runner": None,
    }
    if hasattr(vc, "get_decode_cudagraph_query_lens"):  # 0.34.0 takes the lens, 0.33.0 the len
        kwargs["decode_query_lens"] = vc.get_decode_cudagraph_query_lens(runner.decode_query_len)
    runner.cudagraph_manager = ModelCudaGraphManager(
        vc, runner.device, CUDAGraphMode.NONE, **_accepted(ModelCudaGraphManager.__init__, kwargs)
    )


def _reach_forward(*args: Any, **kwargs: Any) -> Any:
    raise ForwardReached


def _state_cls(shape: Shape) -> type | None:
    if shape.model_state != "deepseek_v41":
        return None
    import importlib

    cls: type = importlib.import_module(DEEPSEEK_STATE).DeepseekV41ModelState
    return cls


def build(shape: Shape, device: RecordingDevice, ledger: RingLedger, users: frozenset[str]) -> V2:
    """The runner for ``shape``; call inside ``device.installed()``, :func:`_ring.cpu_uva` and
    ``ledger.installed()``."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    vc = _config(shape)
    _harness.one_process_world(vc)
    with set_current_vllm_config(vc):
        runner = GPUModelRunner(vc, torch.device("cpu"))
    runner.model = StandinModel(ledger, _state_cls(shape))
    _load(runner, shape)
    _kv_init(runner, shape)
    runner.prepare_inputs = _reach_forward
    ledger.watch(runner, users)
    return V2(runner, vc, device, ledger)


@contextlib.contextmanager
def current_config(v2: V2) -> Iterator[None]:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(v2.config):
        yield


def execute(v2: V2, scheduler_output: Any, kind: str) -> bool:
    """One step's ``execute_model``: True when it launched a forward (False: it returned
    early, a step that schedules no tokens)."""
    v2.ledger.begin(v2.step, kind)
    v2.step += 1
    try:
        with current_config(v2):
            v2.runner.execute_model(scheduler_output)
    except ForwardReached:
        if v2.after_inputs is not None:
            with current_config(v2):
                v2.after_inputs(v2)
        v2.ledger.forward("the input kernels and the forward")
        return True
    return False


def release(v2: V2) -> Any:
    """The step's ``AsyncOutput``, as ``sample_tokens`` creates it (its ``copy_event`` recorded
    after the step's kernels), then the drafter's work, which ``sample_tokens`` runs after it."""
    from ._v2 import async_output

    if v2.drafter is not None and not v2.drafter_after_release:
        v2.drafter(v2)
    output = async_output()
    if v2.drafter is not None and v2.drafter_after_release:
        v2.drafter(v2)
    return output


def serve(v2: V2, steps: list[tuple[str, Any]], *, sync_each: bool = False) -> None:
    """The engine's batch-queue loop over ``steps`` ((kind, SchedulerOutput)): launch a step,
    queue its release (``None`` for a step without a forward: popping it waits for nothing on
    the device), and once ``max_concurrent_batches`` are queued wait for the oldest."""
    for kind, scheduler_output in steps:
        launched = execute(v2, scheduler_output, kind)
        v2.queue.append(release(v2) if launched else None)
        if len(v2.queue) >= v2.batches or sync_each:
            _pop(v2)
    while v2.queue:
        _pop(v2)
    v2.device.synchronize("end of the run")


def _pop(v2: V2) -> None:
    output = v2.queue.popleft()
    if output is not None:
        output.get_output()


def dummy_run(v2: V2) -> None:
    """An idle data-parallel rank's step: ``Worker.execute_dummy_batch``'s real ``_dummy_run``
    (no release: nothing waits for it)."""
    v2.ledger.begin(v2.step, "DP idle rank dummy run")
    v2.step += 1
    runner = v2.runner
    with current_config(v2):
        runner._dummy_run(runner.decode_query_len, uniform_decode=True)
