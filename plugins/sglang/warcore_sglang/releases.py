"""The sglang releases warcore-sglang audited, as data: one entry per release, each derived from
the nearest one with what differs. Pure data (importing this imports nothing of sglang, nor
torch); one code path reads it (the gate picks the installed release's entry exactly, the
activation patches what its entry watches, the plugin names what its registry builds).

Per release: the relied-on functions (signature, digest of the definition:
:mod:`warcore.integration.engine_code`), every watched module with its check-and-patch step
(the step names are the activation's, :data:`warcore_sglang.activation.STEPS`), the structural
checks, and what the declarations need that differs (where the prefill is decided, which
publishes no patched point reaches, the attention registry). How to add a release:
docs/releases.md, "Adding an engine release"; ``warcore release sglang VERSION`` drafts the
entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from warcore.integration.checks import (
    AssignedOnlyIn,
    Attributes,
    Calls,
    CallsWith,
    Check,
    ClassTree,
    Globals,
    InstanceAttribute,
    Members,
    NotRedefined,
    ReturnsList,
)
from warcore.integration.releases import Engine, Release, by_version
from warcore.integration.surface import (
    Definers,
    EnumMembers,
    References,
    Registry,
    Spec,
    Switches,
)

__all__ = ["CONN", "DECODE", "ENGINE", "PAIRING", "RELEASES", "SglangRelease", "TRANSFER_ORDER"]

S = "sglang.srt."


@dataclass(frozen=True)
class SglangRelease(Release):
    prefill: str = "resolver"
    """Who decides a prefill publish: ``resolver`` (``AttentionBackend.
    resolve_prefill_shared_read_ends``, per batch) or ``publisher`` (the module function
    ``maybe_publish_prefill_shared_read_done(model_runner, forward_batch, device_module)``,
    asking the backend's ``shared_read_ends(EXTEND)`` at publish time)."""
    prefill_switch_default: bool = True
    """``SGLANG_ENABLE_PREFILL_WAR_READ_DONE``'s default (``EnvBool``)."""
    unbounded_owners: frozenset[str] = frozenset()
    """Owner roles (``draft``) whose runner publishes without asking any patched point: with
    warcore active, a step owned by one is coarse."""
    decode_unmarked: str = "POST_REPLAY"
    """What sglang's decode runner answers for a declared ``IN_REPLAY`` without its in-graph
    marker (``PRE_REPLAY`` in 0.5.21: earlier than declared; warcore answers POST_REPLAY)."""
    registry: Mapping[str, str] = field(default_factory=dict)
    """Each name of the release's attention registry (``ATTENTION_BACKENDS``) -> the class its
    factory builds on CUDA (``module:Class``, relative to ``sglang.srt``). Which class
    *declares* is asked of that class (its MRO); this only says which class a name builds
    (tests check each factory names its class)."""
    leaves_missing: frozenset[str] = frozenset()
    """Backends of :data:`warcore_sglang._names.LEAVES` this release does not have."""
    plugin_processes: frozenset[str] = frozenset(
        {"launcher", "engine", "scheduler", "detokenizer", "dp-controller"}
    )
    """The processes that call ``load_plugins()`` (so say a start-up line)."""
    lacks: Mapping[str, str] = field(default_factory=dict)
    """``module:qualname`` of a function a later release has and warcore relies on there ->
    what this release does instead (said, so an absent row is a fact, not an omission)."""


_REGISTRY_0_5_23: dict[str, str] = {
    "flashinfer": "layers.attention.flashinfer_backend:FlashInferAttnBackend",
    "llada2_cfg_flashinfer": (
        "layers.attention.llada2_cfg_flashinfer_backend:LLaDA2CFGFlashInferAttnBackend"
    ),
    "trtllm_mla": "layers.attention.trtllm_mla_backend:TRTLLMMLABackend",
    "cutedsl_mla": "layers.attention.cutedsl_mla_backend:CuteDslMLABackend",
    "aiter": "layers.attention.aiter_backend:AiterAttnBackend",
    "wave": "layers.attention.wave_backend:WaveAttnBackend",
    "ascend": "hardware_backend.npu.attention.ascend_backend:AscendAttnBackend",
    "dsa": "layers.attention.dsa_backend:DeepseekSparseAttnBackend",
    "qsa": "layers.attention.qwen_sparse_attn_backend:QwenSparseAttnBackend",
    "nsa": "layers.attention.dsa_backend:DeepseekSparseAttnBackend",
    "dsv4": "layers.attention.deepseek_v4_backend:DeepseekV4AttnBackend",
    "triton": "layers.attention.triton_backend:TritonAttnBackend",
    "torch_native": "layers.attention.torch_native_backend:TorchNativeAttnBackend",
    "flex_attention": "layers.attention.torch_flex_backend:TorchFlexAttnBackend",
    "flashmla": "layers.attention.flashmla_backend:FlashMLABackend",
    "fa3": "layers.attention.flashattention_backend:FlashAttentionBackend",
    "fa4": "layers.attention.flashattention_backend:FlashAttentionBackend",
    "trtllm_mha": "layers.attention.trtllm_mha_backend:TRTLLMHAAttnBackend",
    "hpc_ops": "layers.attention.hpc_ops_backend:HPCOpsAttnBackend",
    "intel_amx": "layers.attention.intel_amx_backend:IntelAMXAttnBackend",
    "minicpm_flashattn": "layers.attention.minicpm.backend:MiniCPMSparseBackend",
    "minicpm_flashinfer": "layers.attention.minicpm.backend:MiniCPMSparseBackend",
    "intel_xpu": "layers.attention.xpu_backend:XPUAttentionBackend",
}

_RUNNER_TREE = ClassTree(
    "DecodeCudaGraphRunner",
    (
        AssignedOnlyIn(
            "in_graph_metadata_prep_done",
            frozenset({"__init__", "_record_in_graph_metadata_prep_done"}),
            exact_on_base=True,
        ),
        AssignedOnlyIn("attn_backend", frozenset({"__init__"}), frozenset({"__init__"})),
        AssignedOnlyIn("enable_pdmux", frozenset({"__init__"}), frozenset({"__init__"})),
        NotRedefined("_replay_attn_backend"),
        CallsWith("_resolve_shared_read_ends", "self._replay_attn_backend()"),
    ),
)
"""The decode runner and every subclass (the runner remembers its answers by mode alone):
only sglang's own two methods plant the in-graph marker; ``attn_backend`` and
``enable_pdmux`` are set in ``__init__`` only; every call of ``_resolve_shared_read_ends``
passes ``self._replay_attn_backend()``, which no subclass redefines."""

_ALGORITHMS = frozenset(
    ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
)

_CHECKS: dict[str, tuple[Check, ...]] = {
    S + "layers.attention.base_attn_backend": (
        Members(
            "SharedReadEnds", {"PRE_REPLAY": 1, "IN_REPLAY": 2, "POST_REPLAY": 3, "UNKNOWN": 4}
        ),
        Globals(("AttentionBackend", "SharedReadEnds")),
    ),
    S + "environ": (
        Attributes(
            "envs", ("SGLANG_FORCE_COARSE_WAR_BARRIER", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
        ),
    ),
    S + "speculative.spec_info": (Members("SpeculativeAlgorithm", _ALGORITHMS),),
    S + "speculative.spec_registry": (Globals(("_REGISTRY", "get_spec", "CustomSpecAlgo")),),
    S + "model_executor.runner.decode_cuda_graph_runner": (
        Calls("DecodeCudaGraphRunner.execute", "_resolve_shared_read_ends"),
        _RUNNER_TREE,
    ),
    S + "model_executor.model_runner": (
        InstanceAttribute("ModelRunner", "shared_read_done_event"),
    ),
}

CONN = S + "disaggregation.mooncake.conn"
DECODE = S + "disaggregation.decode"
REGISTRATION = "MooncakeKVManager.build_receiver_registration_message"
SEND_METADATA = "DecodePreallocQueue._send_kv_metadata"
POP_PREALLOCATED = "DecodePreallocQueue.pop_preallocated"
TRANSFER_ORDER = (DECODE, (SEND_METADATA, POP_PREALLOCATED))
"""The decode side's transfer order (``activation._disagg``): the function it patches (where
the slots' indices leave for the transfer engine) and the one it relies on (allocates the
slots and the row, then calls it): module, qualified names. A release without both rows runs
without the order, said in one line with its ``lacks``."""
PAIRING = (
    CONN,
    (
        REGISTRATION,  # patched: the decode side's registration (marked)
        "KVArgsRegisterInfo.from_zmq",  # patched: the prefill side's parse (remembered)
        "MooncakeKVManager._validate_peer_state_layout",  # patched: its verdict (refused)
        # relied on: a reason recorded per session, logged once at registration, and each
        # transfer to that session concluded failed with it
        "MooncakeKVManager._publish_peer_registration",
        "MooncakeKVManager.transfer_worker",
    ),
)
"""The pairing check (Mooncake): the functions it patches and relies on, as for
:data:`TRANSFER_ORDER`; the registration's frame count is its :class:`ReturnsList` check."""

PREFILL_LOOP = "SchedulerDisaggregationPrefillMixin.event_loop_overlap_disagg_prefill"
DECODE_LOOP = "SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode"
COARSE_READER = "SchedulerDisaggregationPrefillMixin._war_barrier_is_coarse"

_SCALE_OUT_CHECKS: dict[str, tuple[Check, ...]] = {
    # both disaggregated overlap loops apply the barrier after launching a batch
    S + "disaggregation.prefill": (Calls(PREFILL_LOOP, "_apply_war_barrier"),),
    # ... and the decode side hands a request's slots to the transfer engine after allocating
    DECODE: (
        Calls(DECODE_LOOP, "_apply_war_barrier"),
        Calls(POP_PREALLOCATED, "_send_kv_metadata"),
    ),
    # the actor class RayEngine builds (`SchedulerActor.options(...).remote(...)`)
    S + "ray.engine": (Globals(("SchedulerActor", "_create_scheduler_actor")),),
    S + "ray.scheduler_actor": (Globals(("SchedulerActor",)),),
}
"""Where sglang scales out (disaggregation, Ray actors): the shape warcore relies on beyond the
rows' digests. These modules are rows and checks of each entry, not watched: nothing of them is
patched, and ``SchedulerActor`` is a Ray actor class (``@ray.remote``) whose live methods are
Ray's, so the rows are checked from source (``warcore release``, the wheel tests). The PD
patches check the disaggregation modules live, in a PD scheduler, before patching them."""

_PAIRING_CHECKS: dict[str, tuple[Check, ...]] = {
    CONN: (
        # sglang reads the frames it knows by index: the mark is one more, after the last
        ReturnsList(REGISTRATION, 20),
        # the layout verdict is asked at registration (its reason recorded per session)
        Calls("MooncakeKVManager._publish_peer_registration", "_validate_peer_state_layout"),
    ),
}
"""What the pairing check relies on in the Mooncake connector beyond its rows' digests."""

_SCALE_OUT_0_5_23 = {
    S + "disaggregation.prefill": {
        # reads the owner's read-done event: a coarse barrier is deferred past result
        # processing (the loop then applies it before the next batch or an idle wait)
        COARSE_READER: ("(self)", "75d2fdb0c716ca34"),
        PREFILL_LOOP: ("(self)", "3ac17aea7d193222"),
    },
    DECODE: {
        DECODE_LOOP: ("(self)", "3895ea749b2e6166"),
        SEND_METADATA: (
            "(self, decode_req, kv_indices, page_size, state_indices=None, **metadata_kwargs)",
            "685113ba6198efdb",
        ),
        POP_PREALLOCATED: (
            "(self, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None)",
            "64b33a0adf9698a7",
        ),
    },
    CONN: {
        REGISTRATION: ("(self)", "22ca6e271467217d"),
        "KVArgsRegisterInfo.from_zmq": ("(cls, msg)", "d282f51ec226ac8e"),
        "MooncakeKVManager._validate_peer_state_layout": (
            "(self, registration_info)",
            "3d79183a2b900a8f",
        ),
        "MooncakeKVManager._publish_peer_registration": (
            "(self, mooncake_session_id, decode_kv_args)",
            "1a72ba8c1fe50df9",
        ),
        "MooncakeKVManager.transfer_worker": (
            "(self, queue, executor, staging_buffer=None, worker_index=0)",
            "1aa87811a6825f86",
        ),
    },
    S + "ray.scheduler_actor": {
        # builds the Scheduler in the actor, without load_plugins()
        "SchedulerActor.__init__": (
            "(self, server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, "
            "dist_init_addr=None)",
            "c9e1b52c73fd208d",
        ),
    },
    S + "ray.engine": {
        "_create_scheduler_actor": (
            "(pg, bundle_idx, gpu_id, server_args, port_args, tp_rank, pp_rank, dp_rank, "
            "dist_init_addr, rank0_node_ip)",
            "ab9c36d27154877c",
        ),
    },
}

_0_5_23 = SglangRelease(
    "0.5.23",
    functions={
        S + "layers.attention.base_attn_backend": {
            "AttentionBackend.shared_read_ends": ("(self, fm)", "fa4942e6a4a75424"),
            "AttentionBackend.resolve_prefill_shared_read_ends": (
                "(self, forward_batch, *, num_qo_tokens, build_snapshot=True)",
                "8d615ada273bebc1",
            ),
            "AttentionBackend._snapshot_prefill_shared_reads": (
                "(self, forward_batch, *, num_qo_tokens)",
                "8c03c786dba4cb28",
            ),
            "SharedReadEnds.max_of": ("(items)", "9f4ebe77677c0ba2"),
        },
        S + "speculative.spec_info": {
            "SpeculativeAlgorithm.supports_prefill_shared_read_done": (
                "(self)",
                "d5e1ba8d4cce4e6c",
            ),
            "SpeculativeAlgorithm.create_worker": ("(self, server_args)", ""),
        },
        S + "speculative.spec_registry": {
            "CustomSpecAlgo.supports_prefill_shared_read_done": ("(self)", "efcdff41a7c42f6a"),
            "get_spec": ("(name)", ""),
        },
        S + "model_executor.runner.decode_cuda_graph_runner": {
            "DecodeCudaGraphRunner._resolve_shared_read_ends": (
                "(self, attn_backend, forward_mode)",
                "0092106b1a2a2ffe",
            ),
            "DecodeCudaGraphRunner._publish_read_done": ("(self, in_graph)", "260d989dcf9b767d"),
            "DecodeCudaGraphRunner._record_in_graph_metadata_prep_done": (
                "(self)",
                "6ca78dcdd53714be",
            ),
            "DecodeCudaGraphRunner._replay_attn_backend": ("(self)", "d9de93226d5b51cd"),
        },
        S + "model_executor.runner_utils.shared_read_event": {
            "maybe_publish_prefill_shared_read_done": (
                "(model_runner, shared_read_ends, device_module)",
                "e64097ecb4f76153",
            ),
        },
        S + "model_executor.model_runner_components.attention_backend_setup": {
            "_build_full_attention_backend_from_str": (
                "(*, model_runner, backend_str, init_new_workspace)",
                "",
            ),
        },
        S + "managers.tp_worker": {
            "BaseTpWorker.last_shared_read_runner": ("(self)", "7a5c6c423fb8622e"),
        },
        S + "speculative.base_spec_worker": {
            "BaseSpecWorker.last_shared_read_runner": ("(self)", "f578485bb3853498"),
        },
        S + "speculative.eagle_worker_v2": {
            "EAGLEWorkerV2.last_shared_read_runner": ("(self)", "45b014abb26b952d"),
        },
        S + "speculative.multi_layer_eagle_worker_v2": {
            "MultiLayerEagleWorkerV2.last_shared_read_runner": ("(self)", "f39a3482b8a10f8a"),
        },
        S + "speculative.uno_worker_v2": {
            "UnoWorkerV2.last_shared_read_runner": ("(self)", "b645ae08530101a1"),
        },
        S + "managers.scheduler": {
            "Scheduler._apply_war_barrier": ("(self)", "d7d255256af378bc"),
        },
        **_SCALE_OUT_0_5_23,
    },
    watched={
        S + "environ": "check",
        S + "layers.attention.base_attn_backend": "attention backends",
        S + "speculative.spec_info": "algorithms",
        S + "speculative.spec_registry": "custom algorithms",
        S + "model_executor.runner.decode_cuda_graph_runner": "decode runner",
        S + "speculative.base_spec_worker": "spec worker owners",
        S + "managers.tp_worker": "tp worker owners",
        S + "model_executor.model_runner_components.attention_backend_setup": "registry builder",
        S + "model_executor.model_runner": "check",  # the mailbox the owner clears
        S + "model_executor.runner_utils.shared_read_event": "check",  # the prefill publisher
        S + "managers.scheduler": "scheduler",  # the barrier; the checkpoint
    },
    checks={
        **_CHECKS,
        **_SCALE_OUT_CHECKS,
        **_PAIRING_CHECKS,
        S + "disaggregation.prefill": (
            *_SCALE_OUT_CHECKS[S + "disaggregation.prefill"],
            Calls(PREFILL_LOOP, "_war_barrier_is_coarse"),
        ),
    },
    registry=_REGISTRY_0_5_23,
    evidence=(
        "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl (zip entries 2026-10-30): every "
        "row recomputed from its source (tests/test_shape_gate.py); class-level tests "
        "(nox -s sglang), real Engine and HTTP servers, one and two ranks, two nodes "
        "(nox -s sglang_server)"
    ),
)

_PUBLISHER_CALLERS = {
    # the callers import the publisher by name: each binding is patched (warcore's bound
    # reaches every call), and each caller's code is what was audited
    S + "model_executor.runner_utils": "prefill publisher binding",
    S + "model_executor.runner.eager_runner": "prefill publisher binding",
    S + "model_executor.runner.prefill_cuda_graph_runner": "prefill publisher binding",
}

_TOKENSPEED = "layers.attention.tokenspeed_mla_backend:TokenspeedMLABackend"

_0_5_22 = _0_5_23.derive(
    "0.5.22",
    functions={
        S + "layers.attention.base_attn_backend": {
            "AttentionBackend.resolve_prefill_shared_read_ends": None,
            "AttentionBackend._snapshot_prefill_shared_reads": None,
        },
        S + "model_executor.runner_utils.shared_read_event": {
            "maybe_publish_prefill_shared_read_done": (
                "(model_runner, forward_batch, device_module)",
                "3832563ab932ec8e",
            ),
        },
        S + "model_executor.runner.eager_runner": {
            "EagerRunner._execute_extend": (
                "(self, forward_batch, pp_proxy_tensors=None)",
                "5ba6767f461a3261",
            ),
        },
        S + "model_executor.runner.prefill_cuda_graph_runner": {
            "PrefillCudaGraphRunner.execute": (
                "(self, forward_batch, **kwargs)",
                "ed21c27129e5f9e8",
            ),
        },
        S + "disaggregation.prefill": {
            COARSE_READER: None,
            PREFILL_LOOP: ("(self)", "7cbeb8e57bc67e5b"),
        },
        DECODE: {
            POP_PREALLOCATED: (
                "(self, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None)",
                "ac64a20d830a3ebc",
            ),
        },
        CONN: {
            # rows of the functions it has (read from the wheel); the pairing is off without
            # the registration builder (lacks)
            REGISTRATION: None,
            "MooncakeKVManager._validate_peer_state_layout": (
                "(self, registration_info)",
                "d8d6b6557685feae",
            ),
            "MooncakeKVManager._publish_peer_registration": (
                "(self, mooncake_session_id, decode_kv_args)",
                "345ba56871371a04",
            ),
            "MooncakeKVManager.transfer_worker": (
                "(self, queue, executor, staging_buffer=None, worker_index=0)",
                "eb92f87855938327",
            ),
        },
    },
    checks={**_CHECKS, **_SCALE_OUT_CHECKS},
    lacks={
        f"{S}disaggregation.prefill:{COARSE_READER}": (
            "no reader of its own: the disaggregated prefill loop applies the barrier right "
            "after launching each batch, coarse or not (0.5.23 defers a coarse one past "
            "result processing)"
        ),
        f"{CONN}:{REGISTRATION}": (
            "the decode side's registration is built inline in "
            "MooncakeKVReceiver._register_kv_args and sent there (no function returns it for "
            "warcore to mark): no pairing check, sides with and without warcore pair as "
            "sglang pairs them"
        ),
    },
    watched={
        **_0_5_23.watched,
        S + "model_executor.runner_utils.shared_read_event": "prefill publisher",
        **_PUBLISHER_CALLERS,
    },
    prefill="publisher",
    prefill_switch_default=False,
    registry={**_REGISTRY_0_5_23, "tokenspeed_mla": _TOKENSPEED},
    leaves_missing=frozenset({"sglang_minimax_sparse_nvfp4"}),
    evidence=(
        "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl (zip entries 2026-10-15): rows "
        "recomputed from its source; class-level tests and a real Engine "
        "(nox -s 'sglang_release(version=\"0.5.22\")'); the differences: SGLANG-RELEASES "
        "facts in docs/sglang-releases.md"
    ),
)

_0_5_21 = _0_5_22.derive(
    "0.5.21",
    functions={
        S + "model_executor.runner.decode_cuda_graph_runner": {
            # declared IN_REPLAY without the in-graph marker -> PRE_REPLAY ("this lands
            # EARLIER than declared"); warcore answers POST_REPLAY there
            "DecodeCudaGraphRunner._resolve_shared_read_ends": (
                "(self, attn_backend, forward_mode)",
                "c0d11a79285939e0",
            ),
        },
        S + "model_executor.runner.eager_runner": {
            "EagerRunner._execute_extend": (
                "(self, forward_batch, pp_proxy_tensors=None)",
                "a7a43f191a017471",
            ),
        },
        S + "model_executor.runner.prefill_cuda_graph_runner": {
            "PrefillCudaGraphRunner.execute": (
                "(self, forward_batch, **kwargs)",
                "5680821337a2e68d",
            ),
        },
        S + "speculative.eagle_draft_extend_cuda_graph_runner": {
            # publishes before replay without asking any declaration: closed through the owner
            "EAGLEDraftExtendCudaGraphRunner.execute": (
                "(self, forward_batch, select_index)",
                "16d76e2df517522c",
            ),
        },
        S + "disaggregation.prefill": {PREFILL_LOOP: ("(self)", "9555c6382d8ee7da")},
        DECODE: {
            SEND_METADATA: (
                "(self, decode_req, kv_indices, page_size, state_indices=None, **metadata_kwargs)",
                "5043cb74a8ea68d9",
            ),
            POP_PREALLOCATED: (
                "(self, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None)",
                "679d33c1a2de3ab5",
            ),
        },
        CONN: {
            "MooncakeKVManager._validate_peer_state_layout": None,
            "MooncakeKVManager._publish_peer_registration": None,
            "MooncakeKVManager.transfer_worker": (
                "(self, queue, executor, staging_buffer=None, worker_index=0)",
                "8fe6e748106f59a8",
            ),
        },
    },
    lacks={
        **_0_5_22.lacks,
        f"{CONN}:MooncakeKVManager._validate_peer_state_layout": (
            "no layout verdict at registration (nor _publish_peer_registration): a mismatched "
            "peer is rejected per transfer only"
        ),
    },
    watched={**_0_5_22.watched, S + "speculative.eagle_draft_extend_cuda_graph_runner": "check"},
    unbounded_owners=frozenset({"draft"}),
    decode_unmarked="PRE_REPLAY",
    registry={
        name: ref for name, ref in _0_5_22.registry.items() if name != "llada2_cfg_flashinfer"
    },
    plugin_processes=frozenset({"launcher", "engine", "scheduler"}),
    evidence=(
        "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl (zip entries 2026-10-01): rows "
        "recomputed from its source; class-level tests and a real Engine "
        "(nox -s 'sglang_release(version=\"0.5.21\")')"
    ),
)

RELEASES: dict[str, SglangRelease] = by_version((_0_5_21, _0_5_22, _0_5_23))
"""Every audited sglang release, oldest first, by its exact version string."""

SURFACE: Spec = (
    # every class binding a declaration point, the decode runner's publish phase or an event
    # owner (a new speculative worker with its own owner is a new row), with its digest
    Definers(
        "declaration points",
        (
            "shared_read_ends",
            "resolve_prefill_shared_read_ends",
            "_snapshot_prefill_shared_reads",
            "supports_prefill_shared_read_done",
            "_publish_read_done",
            "_record_in_graph_metadata_prep_done",
            "last_shared_read_runner",
        ),
    ),
    # every function reading the read-done event or the owner, or calling the barrier or the
    # prefill publisher, wherever it lives (watched or not), with each use
    References(
        "event readers and barrier callers",
        (
            "shared_read_done_event",
            "last_shared_read_runner",
            "_apply_war_barrier",
            "maybe_publish_prefill_shared_read_done",
        ),
    ),
    Switches("WAR switches", S + "environ", "Envs", r"(^|_)WAR(_|$)"),
    EnumMembers("ForwardMode", S + "model_executor.forward_batch_info", "ForwardMode"),
    EnumMembers("SpeculativeAlgorithm", S + "speculative.spec_info", "SpeculativeAlgorithm"),
    Registry(
        "attention registry",
        S + "layers.attention.attention_registry",
        decorator="register_attention_backend",
    ),
)
"""sglang's WAR surface (``warcore release`` compares a release's with the base entry's,
kept in ``surfaces/<version>.json``)."""

ENGINE = Engine("sglang", "sglang", RELEASES, __name__, surface=SURFACE)
"""warcore-sglang as ``warcore release`` sees it (entry point ``warcore.integrations``)."""
