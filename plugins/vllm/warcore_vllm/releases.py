"""The vLLM releases warcore-vllm audited, as data: one entry per release, each derived from
the nearest one with what differs. Pure data (importing this imports nothing of vLLM, nor
torch); one code path reads it: the gate picks the installed release's entry exactly
(:mod:`warcore_vllm.gate`), the activation patches what its entry watches with the steps its
entry names (:data:`warcore_vllm.activation.STEPS`), the audit runs the checks its entry lists
and the harness builds what its entry preloads.

Per release (:class:`VllmRelease`): every vLLM function the declarations, the audit and the
activation rely on (signature, digest of the definition: :mod:`warcore.integration.engine_code`),
the watched modules with their check-and-patch steps, which runners' staging it declares
(:data:`warcore_vllm.declarations.STAGING`), the staging ring's users and entry points, the
audit's checks and the violations vLLM itself leaves in them. How to add a release:
docs/releases.md, "Adding an engine release"; ``warcore release vllm VERSION`` drafts the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from warcore.core import SharedReadBoundary
from warcore.integration.checks import Calls, Check, Globals
from warcore.integration.releases import Engine, Release, by_version
from warcore.integration.surface import (
    Branches,
    ClassMembers,
    Constructions,
    References,
    Spec,
    StepRunners,
)

from .declarations import COPY_EVENT, RingUser

__all__ = ["ENGINE", "RELEASES", "VllmRelease"]

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
BUFFERS = "vllm.v1.worker.gpu.buffer_utils"
WARMUP = "vllm.v1.worker.gpu.warmup"
DEEPSEEK_STATE = "vllm.models.deepseek_v41.nvidia.model_state"


@dataclass(frozen=True)
class VllmRelease(Release):
    staging: tuple[str, ...] = ()
    """The runners whose staging this release declares (keys of ``declarations.STAGING``)."""
    runner_module: str = ""
    """What a worker that builds the model runner imports (the bench's ``runner`` scenario)."""
    preload: tuple[str, ...] = ()
    """What the audit's harness imports before the recording device is installed."""
    refuses_x86_without_triton: bool = False
    """The CPU platform refuses x86 without Triton (the harness passes that refusal)."""
    entry_points: tuple[str, ...] = ()
    """``UvaBufferPool``'s methods that advance the ring, as the audit expects to read them."""
    audits: tuple[tuple[str, str], ...] = ()
    """(check, configuration) the audit runs, in order (``python -m warcore_vllm.audit``)."""
    expected: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(check, configuration) -> why vLLM leaves it a violation (reported, exit status 0)."""
    ring_users: tuple[RingUser, ...] = ()
    custom_logits_processors: tuple[str, ...] = ()
    """Logits processors of the release that stage through the ring, loaded by the audit's
    runner as ``--logits-processors`` would."""
    warmup: tuple[str, ...] = ()
    """``vllm.v1.worker.gpu.warmup`` functions that run synthetic steps (one verdict each)."""
    unsynced_warmups: tuple[str, ...] = ()
    """Warmup functions whose steps run back to back: the activation's ``warmups`` step has
    each of their steps wait for the device first."""
    warmup_bindings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Warmup function -> the modules that import it by name (their binding is patched too
    where they were imported before the activation; later ones bind the patched one)."""
    dummy_run_stagers: tuple[str, ...] = ()
    """``module:Class`` of the model states that stage a pool in dummy runs: a runner holding
    one takes every step through an event ring."""
    fixes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(check, configuration) of :attr:`expected` the activation makes sound -> how."""
    unfixable: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(check, configuration) of :attr:`expected` the activation leaves as vLLM ships it ->
    why (the audit of the activated configuration says it in the verdict's line)."""


DEEPSEEK_IDLE = "DeepSeek V4.1's state stages in dummy runs, no release"
DEEPSEEK_UBATCH = "DeepSeek V4.1's state: 2 uses a step with 2 microbatches"
WARMUP_KERNELS = "_warmup_kernels's unfixed warmup race (docs/vllm.md)"
DRAFTER = "the drafter reads slots after copy_event"
ZERO_TOKEN = "a zero-token step has no release"

V1_AUDITS = (
    ("v1-event", "default"),
    ("v1-event", "synchronous"),
    ("v1-event", "#47644"),
    ("v1-guard-scope", "any"),
    ("v1-host-buffers", "default"),
    ("v1-host-buffers", "synchronous"),
    ("v1-host-buffers", "#47644"),
    ("v2-ring", "default"),
    ("v2-ring", "pipeline parallel"),
    ("v2-ring", "DP idle rank (modelled)"),
)
SCHEDULER_AUDITS = (
    ("encoder-ring", "encoder-only instance"),
    ("deferred-free", "KV consumer"),
    ("deferred-free", "default"),
    ("swa-settled", "sliding window"),
)
STEP_KINDS = (
    "normal step (async, PP 1)",
    "PP 2, async",
    "PP 2, no async (#47644's shape)",
    "DP idle rank dummy run",
    "zero-token step",
    "zero-token step with staged writes (modelled)",
    "speculative decoding (drafter)",
    "Confidential Computing (NonUvaBuffer slots)",
    "DeepSeek V4.1 state: DP idle rank dummy run",
    "DeepSeek V4.1 state: 2 microbatches",
)
STEP_KINDS_033 = (
    "normal step (async, PP 1)",
    "DP idle rank dummy run",
    "zero-token step",
    "zero-token step with staged writes (modelled)",
    "speculative decoding (drafter)",
    "DeepSeek V4.1 state: DP idle rank dummy run",
    "DeepSeek V4.1 state: 2 microbatches",
)
"""0.33.0's V2 runner in the step kinds whose ring depth a CPU configures as a GPU would (on
this CPU 0.33.0 resolves ``use_v2_model_runner`` to False, so ``max_concurrent_batches``
under pipeline parallelism is the V1 runner's; the modelled ``v2-ring`` covers it); 0.33.0 has
no Confidential Computing staging."""
EXPECTED_BOTH = {
    ("ring-step", "speculative decoding (drafter)"): DRAFTER,
    ("ring-step", "zero-token step with staged writes (modelled)"): ZERO_TOKEN,
    ("ring-step", "DeepSeek V4.1 state: DP idle rank dummy run"): DEEPSEEK_IDLE,
    ("ring-step", "DeepSeek V4.1 state: 2 microbatches"): DEEPSEEK_UBATCH,
    ("warmup", "_warmup_kernels"): WARMUP_KERNELS,
}
"""The violations vLLM leaves in both releases."""

DEEPER_RING = (
    "a deeper ring (set_default_max_concurrency bounded in GPUModelRunner.__init__: uses per "
    "step x steps in flight, one step more with a drafter)"
)
SYNCED_WARMUP = "each warmup step waits for the device first (and the last, when it returns)"
COARSE = "the coarse sync before the input preparation (synchronize_input_prep bounded)"
FIXES_BOTH = {
    ("ring-step", "speculative decoding (drafter)"): DEEPER_RING,
    ("ring-step", "zero-token step with staged writes (modelled)"): (
        "a device synchronize after a step that schedules no tokens (execute_model bounded)"
    ),
    ("ring-step", "DeepSeek V4.1 state: DP idle rank dummy run"): (
        "every step of the runner waits for the one that last used its slots (an event ring "
        "around execute_model, as vLLM's encoder runner's input_tensor_semaphore)"
    ),
    ("ring-step", "DeepSeek V4.1 state: 2 microbatches"): DEEPER_RING,
    ("warmup", "_warmup_kernels"): SYNCED_WARMUP,
}
"""How the activation makes each violation vLLM leaves in both releases sound."""
V2_CHECKS: dict[str, tuple[Check, ...]] = {
    V2_RUNNER: (
        Globals(("set_default_max_concurrency", "GPUModelRunner")),  # the binding patched
        Calls("GPUModelRunner._dummy_run", "execute_model"),  # a dummy run is a step
    ),
}
"""What the V2 runner's patches rely on beyond its functions' digests."""

_0_33_0 = VllmRelease(
    "0.33.0",
    functions={
        V1_RUNNER: {
            "GPUModelRunner.synchronize_input_prep": ("(self)", "cf7bda73c41a9305"),
            "GPUModelRunner._sync_device": ("(self)", "59100b02856c8fb1"),
        },
        "vllm.v1.utils": {"CpuGpuBuffer.copy_to_gpu": ("(self, n=None)", "21666c0293e4e70d")},
        "vllm.config.vllm": {"VllmConfig.max_concurrent_batches": ("(self)", "9814340d4d14d561")},
        BUFFERS: {
            "set_default_max_concurrency": ("(n)", "d539619bf6b8545d"),
            "UvaBufferPool.copy_to_uva": ("(self, x)", "71c256b12faa42b0"),
            "UvaBackedTensor.copy_to_uva": ("(self, n=None)", "c52127a6124b9d7e"),
            "StagedWriteTensor.apply_write": ("(self)", "4d658f35f057bc0b"),
        },
        "vllm.v1.worker.mm_encoder_model_runner": {
            "MMEncoderModelRunner.input_tensor_semaphore": ("(self)", "b388a52d5bdfe6dd"),
        },
        "vllm.v1.core.sched.scheduler": {
            "Scheduler._request_blocks_can_be_freed": ("(self, request)", "5322eb31a21b5dfc"),
            "Scheduler._free_request_blocks": ("(self, request)", "aeaf39576c8a133f"),
            "Scheduler._drain_deferred_frees": ("(self)", "271a3d54b56d58c9"),
        },
        "vllm.v1.worker.gpu.async_utils": {
            "AsyncOutput.get_output": ("(self)", "5f30d6fc238965f0"),
        },
        V2_RUNNER: {
            "GPUModelRunner.execute_model": (
                "(self, scheduler_output, intermediate_tensors=None, dummy_run=False, "
                "skip_attn_for_dummy_run=False, is_profile=False, context_len=0, "
                "valid_dummy_state_slots=False, randomize_inputs=False)",
                "b0612020048ad810",
            ),
            "GPUModelRunner.add_requests": ("(self, scheduler_output)", "d327ae89aaee1356"),
            "GPUModelRunner._dummy_run": (
                "(self, num_tokens, *args, skip_attn=False, uniform_decode=False, "
                "context_len=0, skip_eplb=False, is_profile=False, "
                "valid_dummy_state_slots=False, randomize_inputs=False, **kwargs)",
                "d270e43fbe4de8a5",
            ),
            # sets the ring's depth before any pool is built: the activation bounds it there
            "GPUModelRunner.__init__": ("(self, vllm_config, device)", "1143fa41b54fa1b5"),
        },
        DEEPSEEK_STATE: {
            "DeepseekV41ModelState.prepare_attn": (
                "(self, input_batch, cudagraph_mode, block_tables, slot_mappings, "
                "attn_groups, kv_cache_config, for_capture=False, ubatch_idx=0, "
                "model_specific_attn_metadata=None)",
                "876d3ae5f3572016",
            ),
            "DeepseekV41ModelState._upload_replay_start": (
                "(self, values, num_reqs)",
                "59021981bd988090",
            ),
        },
        WARMUP: {
            "run_mixed_prefill_decode_warmup": (
                "(model_runner, worker_execute_model, worker_sample_tokens, "
                "num_tokens, *, mixed_step_context=None, "
                "req_id_prefix='_v2_mixed_warmup')",
                "b322353005a589c4",
            ),
            "_warmup_kernels": (
                "(model_runner, worker_execute_model, worker_sample_tokens, greedy=False)",
                "3dc2dbc8963410ac",
            ),
        },
    },
    watched={
        V1_RUNNER: "v1 runner",  # the guard, patched (only a V1 worker imports it)
        "vllm.config.vllm": "check",  # VllmConfig.max_concurrent_batches
        "vllm.v1.utils": "check",  # CpuGpuBuffer.copy_to_gpu: the copies the event guards
        BUFFERS: "check",  # the V2 staging ring
        V2_RUNNER: "v2 runner",  # its depth, its steps without a release
        WARMUP: "warmups",  # the warmups that run steps back to back
    },
    checks=V2_CHECKS,
    staging=("v1", "v2", "encoder"),
    runner_module=V1_RUNNER,
    preload=(
        "vllm.config",
        "vllm.distributed",
        V1_RUNNER,
        "vllm.v1.worker.block_table",
        V2_RUNNER,
        WARMUP,
        DEEPSEEK_STATE,
        "vllm.v1.core.sched.async_scheduler",
        "vllm.v1.structured_output",
        "vllm.v1.outputs",
    ),
    entry_points=("copy_to_uva",),
    audits=(
        *V1_AUDITS,
        ("ring-entry-points", "UvaBufferPool"),
        *(("ring-step", kind) for kind in STEP_KINDS_033),
        ("warmup", "run_mixed_prefill_decode_warmup"),
        ("warmup", "_warmup_kernels"),
        *SCHEDULER_AUDITS,
    ),
    expected={
        **EXPECTED_BOTH,
        ("v1-event", "#47644"): "vLLM #47644 (open)",
        ("v1-host-buffers", "#47644"): "vLLM #47644 (open)",
        ("v2-ring", "DP idle rank (modelled)"): "vLLM #54269's class (modelled)",
        ("warmup", "run_mixed_prefill_decode_warmup"): "a warmup race 0.34.0 fixed by hand",
    },
    warmup=("run_mixed_prefill_decode_warmup", "_warmup_kernels"),
    unsynced_warmups=("run_mixed_prefill_decode_warmup", "_warmup_kernels"),
    warmup_bindings={
        "run_mixed_prefill_decode_warmup": (
            "vllm.model_executor.warmup.attention_warmup",
            "vllm.model_executor.warmup.flashinfer_sparse_mla_warmup",
            "vllm.model_executor.warmup.step5_dsa_warmup",
        ),
    },
    dummy_run_stagers=(f"{DEEPSEEK_STATE}:DeepseekV41ModelState",),
    fixes={
        **FIXES_BOTH,
        ("v1-event", "#47644"): COARSE,
        ("v1-host-buffers", "#47644"): COARSE,
        ("warmup", "run_mixed_prefill_decode_warmup"): SYNCED_WARMUP,
    },
    unfixable={
        ("v2-ring", "DP idle rank (modelled)"): (
            "a model, not vLLM's code: a pool use per step with no release, which 0.33.0's own "
            "dummy run does not make (ring-step [DP idle rank dummy run]); the one that does, "
            "DeepSeek V4.1's state, the activation fixes; nothing of vLLM to patch"
        ),
    },
    evidence=(
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (commit g4ba787ec9): every row "
        "recomputed from its source and its live functions (plugins/vllm/tests/test_gate.py); "
        "the audit on its real classes (nox -s \"vllm(release='0.33.0')\")"
    ),
)

_REQUEST_STATE = "RequestState"
_RING_USERS_034 = (
    RingUser(
        _REQUEST_STATE,
        "gpu/states.py:37-63 / :105-115 / :120-125",
        "prompt_len, prefill_len (UvaBackedTensor); total_len, all_token_ids, "
        "num_computed_tokens (StagedWriteTensor: 4 pools each)",
        "new-request steps: every row of prompt_len/prefill_len; the new rows of the three "
        "staged tensors",
    ),
    RingUser(
        "BlockTables",
        "gpu/block_table.py:66-82 / :125-144 / :146-158 (model_runner.py:1849)",
        "one StagedWriteTensor per KV cache group (4 pools); num_blocks (UvaBackedTensor); "
        "FusedStagedWriter (5 pools) with more than one group",
        "every step that is not a dummy run, zero-token steps included: num_blocks (all rows), "
        "the staged rows of new and appended blocks",
    ),
    RingUser(
        "FusedStagedWriter",
        "gpu/buffer_utils.py:301-366 (block_table.py:150-154)",
        "group_ids, indices, starts, cu_lens (copy_to_uva), contents (copy_chunks_to_uva)",
        "each BlockTables.apply_staged_writes with staged rows, when KV cache groups > 1",
    ),
    RingUser(
        "RopeState",
        "gpu/mm/rope.py:46-56 / :58-73 / :75-77",
        "prefill_positions (StagedWriteTensor, uva_instead_of_gpu: 4 pools), prefill_delta "
        "(UvaBackedTensor)",
        "new-request steps: positions (numpy, kept by reference until apply_write) and deltas; "
        "again in an EVS step (model_states/default.py:115)",
    ),
    RingUser(
        "PromptEmbedsState",
        "gpu/model_states/prompt_embeds.py:40-42 / — / :65-68",
        "embeds_ptrs, mask_ptrs, embeds_lens (UvaBackedTensor)",
        "new-request steps; again in an EVS step",
    ),
    RingUser(
        "SamplingStates",
        "gpu/sample/states.py:22-35 / — / :74-79",
        "temperature, top_k, top_p, min_p, seeds (UvaBackedTensor)",
        "new-request steps, all rows; the drafter reads temperature and seeds after copy_event "
        "(ring-step: speculative decoding)",
    ),
    RingUser(
        "LogitBiasState",
        "gpu/sample/logit_bias.py:32-50 / :72-106 / :118-129",
        "5 UvaBackedTensor; 4 StagedWriteTensor (4 pools each)",
        "new-request steps",
    ),
    RingUser(
        "PenaltiesState",
        "gpu/sample/penalties.py:33-40 / — / :65-86",
        "3 UvaBackedTensor",
        "new-request steps",
    ),
    RingUser(
        "BadWordsState",
        "gpu/sample/bad_words.py:30-38 / :69-70 / :74-77",
        "1 UvaBackedTensor; 2 StagedWriteTensor",
        "new-request steps",
    ),
    RingUser(
        "ThinkingBudgetState",
        "gpu/sample/thinking_budget.py:53-57 / — / :98-111",
        "1 UvaBackedTensor",
        "new-request steps, when enabled and dirty",
    ),
    RingUser(
        "LogprobTokenIdsState",
        "gpu/sample/logprob.py:246-251 / :264 / :266-268",
        "1 UvaBackedTensor; 1 StagedWriteTensor",
        "new-request steps",
    ),
    RingUser(
        "TraceReplayState",
        "gpu/sample/trace_replay.py:26-32 / :38 / :42-44",
        "1 UvaBackedTensor; 1 StagedWriteTensor (uva_instead_of_gpu)",
        "new-request steps, when enabled",
    ),
    RingUser(
        "GPUWatermarkSampler",
        "v1/watermarking/gpu_sampler.py:33-37 / — / :49-51",
        "watermarking (UvaBackedTensor)",
        "new-request steps",
    ),
    RingUser(
        "NoRepeatNGramLogitsProcessor",
        "model_executor/models/ming_v3_asr_logits_processor.py:31 / — / :40-41",
        "sizes (UvaBackedTensor)",
        "new-request steps",
    ),
    RingUser(
        "PageCountGuardLogitsProcessor",
        "model_executor/models/unlimited_ocr2.py:240-243 / :290-317 / :320-322",
        "_params, _state (StagedWriteTensor)",
        "new-request steps",
    ),
    RingUser(
        "MMEncoderModelRunner",
        "v1/worker/mm_encoder_model_runner.py:134-154",
        "the RequestState and BlockTables pools",
        "each step, inside input_tensor_semaphore",
        release="input_tensor_semaphore (a blocking event per slot, synchronized on entry)",
        host_reads=SharedReadBoundary.PRE_REPLAY,
        audited="check",
    ),
    RingUser(
        "DeepseekV41ModelState",
        "models/deepseek_v41/nvidia/model_state.py:218, :232, :235 / — / :438-442",
        "_replay_start_staging, _pcp_replay_start, _dropped_before (UvaBufferPool)",
        "_upload_replay_start (copy_to_gpu) at every prepare_attn: dummy runs too, and once "
        "per microbatch",
        release=COPY_EVENT + "; none in a dummy run",
        audited="check",
    ),
    RingUser(
        "DiffusionSampler",
        "model_executor/models/diffusion_gemma.py:1214-1217 / — / :1374-1377, :1423-1426",
        "_decode_slots, _decode_idx, _query_lens, _num_logits (UvaBackedTensor)",
        "every sampling call (one per step), read by its sampler kernels before AsyncOutput",
        audited="read",
        module="vllm.model_executor.models.diffusion_gemma",
    ),
)


_0_34_0 = _0_33_0.derive(
    "0.34.0",
    functions={
        # Model Runner V1 removed (VLLM-0.34 §1.1), and with it the copies its event guarded
        V1_RUNNER: {
            "GPUModelRunner.synchronize_input_prep": None,
            "GPUModelRunner._sync_device": None,
        },
        "vllm.v1.utils": {"CpuGpuBuffer.copy_to_gpu": None},
        # its V1 branch gone: pp+1 with async, else pp
        "vllm.config.vllm": {"VllmConfig.max_concurrent_batches": ("(self)", "05344b507e57f9ca")},
        BUFFERS: {
            # the round robin moved into _next_buf, which the new copy_chunks_to_uva shares
            "UvaBufferPool._next_buf": ("(self, n)", "fe244b9e2aaee0a3"),
            "UvaBufferPool.copy_to_uva": ("(self, x)", "b5fcc71e1d15ca6e"),
            "UvaBufferPool.copy_chunks_to_uva": ("(self, chunks, n)", "40185d6df6a28bb0"),
            "UvaBufferPool.copy_to_gpu": ("(self, x, out=None)", "e997748aa5e58004"),
            "NonUvaBuffer.uva": ("(self, n=None)", "e6623f53fabb5e9d"),
            # arrays kept by reference until apply_write; contents always through a pool
            "StagedWriteTensor.stage_write": ("(self, index, start, x)", "3354b84e6750a0e9"),
            "StagedWriteTensor.apply_write": ("(self)", "f6a78984425a19dc"),
            "FusedStagedWriter.apply": (
                "(self, tensors, output_ptrs, output_strides)",
                "e0213aca690dc78f",
            ),
        },
        "vllm.v1.engine.core": {
            "EngineCore.step_with_batch_queue": ("(self)", "59c246170cf20b2d"),
        },
        V2_RUNNER: {
            "GPUModelRunner.execute_model": (
                "(self, scheduler_output, intermediate_tensors=None, dummy_run=False, "
                "skip_attn_for_dummy_run=False, is_profile=False, context_len=0, "
                "valid_dummy_state_slots=False, randomize_inputs=False)",
                "b0ff0d5d6ea7923f",
            ),
            "GPUModelRunner.add_requests": ("(self, scheduler_output)", "d20c48b0f8571b15"),
            "GPUModelRunner.sample_tokens": ("(self, grammar_output)", "fd2b23c1c267d4bc"),
            "GPUModelRunner.__init__": ("(self, vllm_config, device)", "1ec36ac8e7303878"),
            "GPUModelRunner._dummy_run": (
                "(self, num_tokens, *args, skip_attn=False, uniform_decode=False, "
                "context_len=0, skip_eplb=False, is_profile=False, "
                "valid_dummy_state_slots=False, randomize_inputs=False, **kwargs)",
                "816981015fc4d78f",
            ),
        },
        WARMUP: {
            # two warmups now synchronize after each step (_run_step); _warmup_kernels does not
            "_run_step": (
                "(worker_execute_model, worker_sample_tokens, scheduler_output)",
                "16e66390574e6f38",
            ),
            "run_mixed_prefill_decode_warmup": (
                "(model_runner, worker_execute_model, worker_sample_tokens, "
                "num_tokens, *, mixed_step_context=None, "
                "req_id_prefix='_v2_mixed_warmup', prompt_logprobs=None, "
                "prefill_only_fallback=False)",
                "1ff02d8b7c06f5c6",
            ),
            "run_context_prefill_warmup": (
                "(model_runner, worker_execute_model, worker_sample_tokens, num_context_tokens)",
                "dab7ec2ef654edb6",
            ),
            "_warmup_kernels": (
                "(model_runner, worker_execute_model, worker_sample_tokens, greedy=False)",
                "b0640522617c6f58",
            ),
        },
        "vllm.v1.worker.gpu.spec_decode.speculator": {
            "DraftModelSpeculator._copy_request_inputs": (
                "(self, num_reqs, idx_mapping, temperature, seeds, dummy_run=False)",
                "6033045964925ec1",
            ),
        },
        # Confidential Computing (new): slots uploaded in place on a staging stream
        "vllm.v1.conf_compute_utils": {
            "register_inplace_h2d_target": ("(tensor)", "c4e414f1f545d7aa"),
            "_h2d_inplace": ("(out, src)", "604fab1aa8d7aff9"),
        },
    },
    watched={
        "vllm.config.vllm": "check",  # VllmConfig.max_concurrent_batches: the ring's depth
        BUFFERS: "check",  # the staging ring
        V2_RUNNER: "v2 runner",  # its depth, its steps without a release
        WARMUP: "warmups",  # _warmup_kernels still runs its steps back to back
    },
    staging=("v2", "encoder"),
    runner_module=V2_RUNNER,
    preload=(
        "vllm.config",
        "vllm.distributed",
        V2_RUNNER,
        WARMUP,
        "vllm.v1.worker.gpu.block_table",
        "vllm.v1.worker.cpu.buffer_utils",
        "vllm.v1.conf_compute_utils",
        "vllm.v1.watermarking.gpu_sampler",
        "vllm.v1.worker.gpu.spec_decode.speculator",
        DEEPSEEK_STATE,
        "vllm.model_executor.models.ming_v3_asr_logits_processor",
        "vllm.model_executor.models.unlimited_ocr2",
        "vllm.v1.core.sched.async_scheduler",
        "vllm.v1.structured_output",
        "vllm.v1.outputs",
    ),
    refuses_x86_without_triton=True,
    entry_points=("copy_to_uva", "copy_chunks_to_uva"),
    audits=(
        ("ring-entry-points", "UvaBufferPool"),
        *(("ring-user", u.name) for u in _RING_USERS_034 if u.audited != "check"),
        *(("ring-step", kind) for kind in STEP_KINDS),
        ("warmup", "run_mixed_prefill_decode_warmup"),
        ("warmup", "run_context_prefill_warmup"),
        ("warmup", "_warmup_kernels"),
        ("staged-by-reference", "stage_write callers"),
        *SCHEDULER_AUDITS,
    ),
    expected=EXPECTED_BOTH,
    ring_users=_RING_USERS_034,
    custom_logits_processors=(
        "vllm.model_executor.models.ming_v3_asr_logits_processor:NoRepeatNGramLogitsProcessor",
        "vllm.model_executor.models.unlimited_ocr2:PageCountGuardLogitsProcessor",
    ),
    warmup=("run_mixed_prefill_decode_warmup", "run_context_prefill_warmup", "_warmup_kernels"),
    unsynced_warmups=("_warmup_kernels",),  # the other two go through _run_step
    warmup_bindings={},
    fixes=FIXES_BOTH,
    unfixable={},
    evidence=(
        "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl (commit g62d4bc3c7): every row "
        "recomputed from its source and its live functions (plugins/vllm/tests/test_gate.py); "
        "the audit on its real classes (nox -s \"vllm(release='0.34.0')\"); what changed: "
        "/work/shared/VLLM-0.34.md §1.2"
    ),
)

RELEASES: dict[str, VllmRelease] = by_version((_0_33_0, _0_34_0))
"""Every audited vLLM release, oldest first, by its exact version string (``0.33.0+cpu`` and
other local builds are other code)."""

SURFACE: Spec = (
    # the ring itself: a new method is a new entry point (0.34.0's copy_chunks_to_uva)
    ClassMembers("ring entry points", BUFFERS, "UvaBufferPool"),
    # every caller of an entry point, wherever it lives, with each call
    References("ring callers", ("copy_to_uva", "copy_chunks_to_uva", "_next_buf")),
    # the ring users, by owner: every pool or pooled tensor constructed
    Constructions(
        "ring users",
        ("UvaBufferPool", "UvaBackedTensor", "StagedWriteTensor", "FusedStagedWriter"),
    ),
    # every function that runs steps (or hands the step functions on), with where it waits
    StepRunners(
        "step runners",
        steps=("worker_execute_model", "worker_sample_tokens", "_run_step"),
        waits=("synchronize", "_sync_device", "synchronize_input_prep"),
    ),
    Branches("ring depth", "vllm.config.vllm", "VllmConfig.max_concurrent_batches"),
)
"""vLLM's WAR surface (``warcore release`` compares a release's with the base entry's, kept
in ``surfaces/<version>.json``)."""

ENGINE = Engine("vllm", "vllm", RELEASES, __name__, surface=SURFACE)
"""warcore-vllm as ``warcore release`` sees it (entry point ``warcore.integrations``)."""
