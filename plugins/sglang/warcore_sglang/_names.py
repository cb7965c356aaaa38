"""How sglang's names meet warcore's: the ``sglang_`` prefix, the classes behind each name, and
the engine flags that describe a wrapper's children. Pure data: importing this imports nothing
of sglang (nor torch).

Backends. Every name in sglang's attention registry (``ATTENTION_BACKENDS``: ``dsv4``,
``trtllm_mha``, ``fa3``, ...) is the warcore backend ``sglang_<name>``; sglang's wrappers and the
backends they build around a registry backend have fixed names (:data:`WRAPPERS`,
:data:`LEAVES`). The prefix keeps them apart from the reference engine's own backends
(``trtllm_mha``, ``deepseek_v4``), which model sglang's (``BackendSpec.models``).

Algorithms. ``SpeculativeAlgorithm.NONE`` is warcore's ``none`` (no speculation, engine-neutral);
every other member ``M`` is ``sglang_<m>`` (``sglang_eagle``, ``sglang_dspark``, ...), and a
custom algorithm registered through sglang's ``spec_registry`` under ``NAME`` is
``sglang_<name>``.

A registry name stands for the class its factory builds on CUDA (:data:`REGISTRY_CLASSES`): on
HIP and NPU ``dsv4`` builds classes that keep the base declaration (TARGET_VERIFY IN_REPLAY,
which the decode runner degrades to POST_REPLAY there, having no in-graph event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUDITED",
    "BASE",
    "FLAG_SPECS",
    "LEAVES",
    "MAX_DEPTH",
    "PREFIX",
    "REGISTRY_CLASSES",
    "SUPPORTED",
    "TAG",
    "WRAPPERS",
    "WRAPPER_SHAPES",
    "WrapperShape",
    "algorithm_to_warcore",
    "child_name",
    "flag_value",
    "warcore_name",
]

PREFIX = "sglang_"
SRT = "sglang.srt."

TAG = "_warcore_sglang_name"
"""Instance attribute the activation sets on each backend sglang's registry builds: its warcore
name (``sglang_fa4`` and ``sglang_fa3`` build the same class)."""

MAX_DEPTH = 8
"""Wrappers nest at most this deep (two-batch overlap of a hybrid of ...)."""

AUDITED: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "0.5.23": {
        "layers.attention.base_attn_backend": {
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
        "speculative.spec_info": {
            "SpeculativeAlgorithm.supports_prefill_shared_read_done": (
                "(self)",
                "d5e1ba8d4cce4e6c",
            ),
            "SpeculativeAlgorithm.create_worker": ("(self, server_args)", ""),
        },
        "speculative.spec_registry": {
            "CustomSpecAlgo.supports_prefill_shared_read_done": ("(self)", "efcdff41a7c42f6a"),
            "get_spec": ("(name)", ""),
        },
        "model_executor.runner.decode_cuda_graph_runner": {
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
        "model_executor.runner_utils.shared_read_event": {
            "maybe_publish_prefill_shared_read_done": (
                "(model_runner, shared_read_ends, device_module)",
                "e64097ecb4f76153",
            ),
        },
        "model_executor.model_runner_components.attention_backend_setup": {
            "_build_full_attention_backend_from_str": (
                "(*, model_runner, backend_str, init_new_workspace)",
                "",
            ),
        },
        "managers.tp_worker": {
            "BaseTpWorker.last_shared_read_runner": ("(self)", "7a5c6c423fb8622e"),
        },
        "speculative.base_spec_worker": {
            "BaseSpecWorker.last_shared_read_runner": ("(self)", "f578485bb3853498"),
        },
        "speculative.eagle_worker_v2": {
            "EAGLEWorkerV2.last_shared_read_runner": ("(self)", "45b014abb26b952d"),
        },
        "speculative.multi_layer_eagle_worker_v2": {
            "MultiLayerEagleWorkerV2.last_shared_read_runner": ("(self)", "f39a3482b8a10f8a"),
        },
        "speculative.uno_worker_v2": {
            "UnoWorkerV2.last_shared_read_runner": ("(self)", "b645ae08530101a1"),
        },
        "managers.scheduler": {
            "Scheduler._apply_war_barrier": ("(self)", "d7d255256af378bc"),
        },
    },
}
"""The sglang versions warcore-sglang was read from and tested against, exactly (``0.5.23``,
not ``0.5.23.post1``, ``0.5.23.1`` nor a local build ``0.5.23+g1234abc``: another build is
other code), each with what the activation relies on in it: module (relative to
``sglang.srt``) -> ``Qualname`` -> (its signature, the digest of its code, or ``""`` where
only the signature matters). The shape gate (:mod:`warcore_sglang.activation._shape`) checks
them where each module is patched; ``tests/test_shape_gate.py`` recomputes them from the
installed wheel. To audit a new version: read its WAR-barrier code against
``SGLANG-DRIFT.md``, run the tests on it, and add its table here
(``python -m warcore_sglang.activation._shape`` prints the installed sglang's)."""

(_ONLY_AUDITED,) = AUDITED  # a second audited version needs a scope that admits both (no ===)
SUPPORTED = f"sglang==={_ONLY_AUDITED}"
"""The audited version as an implementation range: every answer of the plugin is
``warcore.Declared(boundary, SUPPORTED)``, so another installed sglang makes them stale (not
applied, reported by ``warcore check``), and :func:`warcore_sglang.install` refuses to patch
it. ``===`` compares the version string exactly (``==0.5.23`` would admit local builds)."""

BASE = "sglang_base"
"""``AttentionBackend`` itself: the base declaration every backend without its own inherits."""

REGISTRY_CLASSES: dict[str, str] = {
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
"""sglang 0.5.23's registry name -> the class its factory builds on CUDA (``module:Class``,
relative to ``sglang.srt``). Which class *declares* is asked of that class (its MRO); the table
only says which class a name builds (tests check each factory names its class)."""

LEAVES: dict[str, str] = {
    BASE: "layers.attention.base_attn_backend:AttentionBackend",
    "sglang_dots_hybrid": "layers.attention.dots_hybrid_backend:DotsHybridAttnBackend",
    "sglang_minimax_sparse": "layers.attention.minimax_sparse_backend:MiniMaxSparseAttnBackend",
    "sglang_minimax_sparse_nvfp4": (
        "layers.attention.minimax_sparse_nvfp4_backend:MiniMaxSparseNvfp4AttnBackend"
    ),
    "sglang_mamba2": "layers.attention.hybrid_linear_attn_backend:Mamba2AttnBackend",
    "sglang_gdn": "layers.attention.linear.gdn_backend:GDNAttnBackend",
    "sglang_kda": "layers.attention.linear.kda_backend:KDAAttnBackend",
    "sglang_lightning": "layers.attention.linear.lightning_backend:LightningAttentionBackend",
    "sglang_short_conv": "layers.attention.linear.short_conv_backend:ShortConvAttnBackend",
}
"""Backends sglang builds outside its registry (model-level wrappers' parts), and the base.
``DotsHybridAttnBackend`` wraps two backends but declares nothing of its own (the base
declaration, whatever its children): a leaf for warcore, as for sglang."""


@dataclass(frozen=True)
class WrapperShape:
    """One of sglang's composite backends: its class, the flags naming its children (by name,
    in the matrix) and where sglang's wrapper object holds them. The one place a wrapper's
    layout is spelled: the oracle builds bare wrappers from it (:mod:`warcore_sglang._sglang`),
    the activation reads a live wrapper's children through it (its identity), and the plugin
    describes each wrapper from it."""

    name: str
    cls: str
    children: tuple[str, ...]
    """One entry per child, in the order sglang's wrapper holds them: the flag that names it,
    or ``=<warcore name>`` for a child that is always the same backend."""
    holds: tuple[str, ...]
    """The wrapper's attributes holding those children, in the same order: one attribute per
    child, or ``*<attribute>`` for a list holding every child left."""
    aliases: tuple[str, ...] = ()
    """Attributes naming the children one by one besides the list that holds them (set on a
    bare wrapper too: sglang's methods read either)."""
    switches: tuple[tuple[str, str], ...] = ()
    """(flag, attribute) of each boolean the wrapper reads besides its children."""
    selecting: bool = False
    """The wrapper runs one child per mode (``_select_backend``), not all of them."""
    description: str = ""

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(c for c in self.children if not c.startswith("="))

    def children_of(self, wrapper: Any) -> list[Any]:
        """The children a live (or bare) wrapper object holds, in :attr:`children`' order."""
        kids: list[Any] = []
        for attr in self.holds:
            if attr.startswith("*"):
                kids.extend(getattr(wrapper, attr[1:]))
            else:
                kids.append(getattr(wrapper, attr))
        return kids

    def attributes(self, kids: list[Any]) -> dict[str, Any]:
        """The attributes that make a bare wrapper hold ``kids`` where sglang's class keeps
        them (the inverse of :meth:`children_of`)."""
        out: dict[str, Any] = {}
        for i, attr in enumerate(self.holds):
            if attr.startswith("*"):
                out[attr[1:]] = kids[i:]
                break
            out[attr] = kids[i]
        out.update(zip(self.aliases, kids, strict=False))
        return out


WRAPPER_SHAPES: tuple[WrapperShape, ...] = (
    WrapperShape(
        "sglang_hybrid",
        "layers.attention.hybrid_attn_backend:HybridAttnBackend",
        ("sglang_hybrid_prefill", "sglang_hybrid_decode"),
        holds=("prefill_backend", "decode_backend"),
        switches=(("sglang_spec_attn_is_decode", "spec_attn_is_decode"),),
        selecting=True,
        description="sglang's HybridAttnBackend: a prefill and a decode backend "
        "(--prefill/--decode-attention-backend); verify on the decode one when "
        "sglang_spec_attn_is_decode",
    ),
    WrapperShape(
        "sglang_tbo",
        "layers.attention.tbo_backend:TboAttnBackend",
        ("sglang_tbo_child", "sglang_tbo_child", "sglang_tbo_child"),
        holds=("primary", "*children"),
        description="sglang's TboAttnBackend (two-batch overlap): the latest of its "
        "primary and two children, all built alike",
    ),
    WrapperShape(
        "sglang_hybrid_linear",
        "layers.attention.hybrid_linear_attn_backend:HybridLinearAttnBackend",
        ("sglang_hybrid_linear_full", "sglang_hybrid_linear_linear"),
        holds=("*attn_backend_list",),
        aliases=("full_attn_backend", "linear_attn_backend"),
        description="sglang's HybridLinearAttnBackend: the latest of its full-attention "
        "and linear-attention backends",
    ),
    WrapperShape(
        "sglang_dots_swa_mla",
        "layers.attention.dots_hybrid_backend:DotsSWAMLAAttnBackend",
        ("sglang_dots_swa_mla_backend",),
        holds=("backend",),
        description="sglang's DotsSWAMLAAttnBackend: UNKNOWN for plain extend, else its backend's",
    ),
    WrapperShape(
        "sglang_minimax_hybrid",
        "layers.attention.minimax_sparse_backend:MiniMaxHybridAttnBackend",
        ("=sglang_minimax_sparse", "sglang_minimax_dense"),
        holds=("sparse", "dense"),
        description="sglang's MiniMaxHybridAttnBackend: the latest of its sparse "
        "(MiniMaxSparseAttnBackend) and dense backends",
    ),
)
"""sglang 0.5.23's composite backends, the one table of their shapes."""

WRAPPERS: dict[str, WrapperShape] = {w.name: w for w in WRAPPER_SHAPES}
""":data:`WRAPPER_SHAPES` by warcore name."""

FLAG_SPECS: tuple[tuple[str, type, bool | str, str], ...] = (
    ("sglang_hybrid_prefill", str, "flashinfer", "sglang_hybrid's prefill backend (sglang name)"),
    ("sglang_hybrid_decode", str, "flashinfer", "sglang_hybrid's decode backend (sglang name)"),
    (
        "sglang_spec_attn_is_decode",
        bool,
        False,
        "sglang_hybrid runs target-verify on its decode backend (sglang's "
        "--speculative-attention-mode decode; its default, prefill, is false)",
    ),
    ("sglang_tbo_child", str, "flashinfer", "what sglang_tbo's primary and children are"),
    ("sglang_hybrid_linear_full", str, "flashinfer", "sglang_hybrid_linear's full attention"),
    ("sglang_hybrid_linear_linear", str, "mamba2", "sglang_hybrid_linear's linear attention"),
    ("sglang_dots_swa_mla_backend", str, "flashinfer", "what sglang_dots_swa_mla wraps"),
    ("sglang_minimax_dense", str, "flashinfer", "sglang_minimax_hybrid's dense backend"),
)
"""(name, kind, default, description) of the engine flags warcore-sglang reads; turned into
``warcore.FlagSpec`` by the plugin's ``warcore_engine_flags``. A backend is named by its
sglang name (``dsv4``, ``hybrid``, ``mamba2``) or its warcore name (``sglang_dsv4``)."""

_DEFAULTS = {name: default for name, _, default, _ in FLAG_SPECS}


def warcore_name(sglang_name: str) -> str:
    """``dsv4`` -> ``sglang_dsv4`` (a name already prefixed is kept)."""
    return sglang_name if sglang_name.startswith(PREFIX) else PREFIX + sglang_name


def child_name(value: object) -> str:
    """A flag's backend value as a warcore backend name."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"a backend flag needs a backend name, got {value!r}")
    return warcore_name(value.strip())


def flag_value(flags: tuple[tuple[str, object], ...], name: str) -> object:
    """``context.flags``' value for ``name``, or its declared default."""
    for key, value in flags:
        if key == name:
            return value
    return _DEFAULTS[name]


def algorithm_to_warcore(member_name: str) -> str:
    """sglang's algorithm name (``EAGLE``, ``NONE``, a custom ``MY_SPEC``) -> warcore's."""
    lower = member_name.strip().lower()
    return "none" if lower == "none" else PREFIX + lower
