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

A registry name stands for the class its factory builds on CUDA (each release's ``registry``,
:mod:`warcore_sglang.releases`): on HIP and NPU ``dsv4`` builds classes that keep the base
declaration (TARGET_VERIFY IN_REPLAY,
which the decode runner degrades to POST_REPLAY there, having no in-graph event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "BASE",
    "FLAG_SPECS",
    "LEAVES",
    "MAX_DEPTH",
    "PREFIX",
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

BASE = "sglang_base"
"""``AttentionBackend`` itself: the base declaration every backend without its own inherits."""

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
    layout is spelled: the oracle builds bare wrappers from it
    (:mod:`warcore_sglang.declarations.oracle`),
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
"""sglang's composite backends (the same in every audited release), the one table of their
shapes."""

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
