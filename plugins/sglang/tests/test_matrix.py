"""``warcore matrix --json`` with warcore-sglang installed gives, for sglang's backends, exactly
what sglang 0.5.23's own ``shared_read_ends`` returns, mode by mode, and each algorithm's
prefill publish gate is sglang's ``supports_prefill_shared_read_done()``.

The expected values are computed here by calling sglang's real methods on bare objects built
by hand (``_real.py``); the matrix runs as a subprocess (``warcore matrix --json --flag ...``),
once per flag set: hybrid with verify on the decode backend and on the prefill backend, each
with a different two-batch-overlap child, hybrid-linear, Dots and MiniMax children.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from _real import (
    algorithm,
    dots_swa_mla,
    hybrid,
    hybrid_linear,
    leaf,
    minimax_hybrid,
    tbo,
    warcore_cli,
)
from _release import RELEASE

FLAG_SETS: dict[str, dict[str, str]] = {
    "verify_on_decode": {
        "sglang_hybrid_prefill": "trtllm_mha",
        "sglang_hybrid_decode": "dsv4",
        "sglang_spec_attn_is_decode": "1",
        "sglang_tbo_child": "hybrid",  # two-batch overlap of the hybrid: nested wrappers
        "sglang_hybrid_linear_full": "dsv4",
        "sglang_hybrid_linear_linear": "mamba2",
        "sglang_dots_swa_mla_backend": "dsv4",
        "sglang_minimax_dense": "trtllm_mha",
    },
    "verify_on_prefill": {
        "sglang_hybrid_prefill": "trtllm_mha",
        "sglang_hybrid_decode": "dsv4",
        "sglang_spec_attn_is_decode": "0",
        "sglang_tbo_child": "trtllm_mha",
        "sglang_hybrid_linear_full": "trtllm_mha",
        "sglang_hybrid_linear_linear": "mamba2",
        "sglang_dots_swa_mla_backend": "trtllm_mha",
        "sglang_minimax_dense": "dsv4",
    },
}


def _expected_objects(flags: dict[str, str]) -> dict[str, Callable[[Any], Any]]:
    """warcore backend name -> (sglang algorithm -> the bare sglang object it stands for)."""
    is_decode = flags["sglang_spec_attn_is_decode"] == "1"

    def named(name: str) -> Callable[[Any], Any]:
        if name == "hybrid":
            return lambda a: hybrid(leaf("trtllm_mha", a), leaf("dsv4", a), is_decode)
        return lambda a: leaf(name, a)

    child = named(flags["sglang_tbo_child"])
    objects: dict[str, Any] = {
        "sglang_base": lambda a: leaf("base", a),
        "sglang_triton": lambda a: leaf("triton", a),  # a registry backend with the base's
        "sglang_flashinfer": lambda a: leaf("flashinfer", a),
        "sglang_trtllm_mha": lambda a: leaf("trtllm_mha", a),
        "sglang_dsv4": lambda a: leaf("dsv4", a),
        "sglang_hybrid": named("hybrid"),
        "sglang_tbo": lambda a: tbo(lambda: child(a)),
        "sglang_hybrid_linear": lambda a: hybrid_linear(
            named(flags["sglang_hybrid_linear_full"])(a), leaf("mamba2", a)
        ),
        "sglang_dots_swa_mla": lambda a: dots_swa_mla(
            named(flags["sglang_dots_swa_mla_backend"])(a)
        ),
        "sglang_dots_hybrid": lambda a: leaf("dots_hybrid", a),
        "sglang_minimax_hybrid": lambda a: minimax_hybrid(
            named(flags["sglang_minimax_dense"])(a), a
        ),
        "sglang_minimax_sparse": lambda a: leaf("minimax_sparse", a),
        "sglang_minimax_sparse_nvfp4": lambda a: leaf("minimax_sparse_nvfp4", a),
        "sglang_mamba2": lambda a: leaf("mamba2", a),
    }
    for name in RELEASE.leaves_missing:  # a backend this release does not have
        del objects[name]
    return objects


@pytest.fixture(scope="module", params=sorted(FLAG_SETS))
def matrix(request: pytest.FixtureRequest) -> tuple[dict[str, str], dict[str, Any]]:
    flags = FLAG_SETS[request.param]
    args = [arg for name, value in flags.items() for arg in ("--flag", f"{name}={value}")]
    done = warcore_cli("matrix", "--json", *args)
    return flags, json.loads(done.stdout)


def test_every_sglang_backend_and_mode_is_what_sglang_declares(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    flags, data = matrix
    objects = _expected_objects(flags)
    rows = {(r["backend"], r["mode"], r["algorithm"]): r for r in data["rows"]}
    algorithms = sorted({r["algorithm"] for r in data["rows"] if r["backend"] == "sglang_dsv4"})
    assert {"none", "sglang_eagle", "sglang_dspark", "sglang_dflash"} <= set(algorithms)
    checked = 0
    for backend, make in objects.items():
        for name in algorithms:
            obj = make(algorithm(name))
            for mode in ForwardMode:  # sglang's nine modes
                row = rows[(backend, mode.name, name)]
                want = type(obj).shared_read_ends(obj, mode).name
                assert row["boundary"] == want, (backend, mode.name, name, row)
                assert "sglang" in row["boundary_source"], row
                checked += 1
            # DRAFT_EXTEND is warcore's alone (not in sglang 0.5.23): sglang declares nothing.
            row = rows[(backend, "DRAFT_EXTEND", name)]
            assert "sglang" not in row["boundary_source"], row
    assert checked == len(objects) * len(algorithms) * 9


def test_dsv4_verify_depends_on_the_algorithm(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    _, data = matrix
    verify = {
        r["algorithm"]: r["boundary"]
        for r in data["rows"]
        if r["backend"] == "sglang_dsv4" and r["mode"] == "TARGET_VERIFY"
    }
    assert verify["none"] == "POST_REPLAY"
    assert verify["sglang_eagle"] == "POST_REPLAY"
    assert verify["sglang_dflash"] == "POST_REPLAY"  # is_dspark() only, not the dflash family
    assert verify["sglang_dspark"] == "IN_REPLAY"


def test_hybrid_verify_follows_spec_attn_is_decode(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    flags, data = matrix
    row = next(
        r
        for r in data["rows"]
        if (r["backend"], r["mode"], r["algorithm"])
        == ("sglang_hybrid", "TARGET_VERIFY", "sglang_eagle")
    )
    on_decode = flags["sglang_spec_attn_is_decode"] == "1"
    assert row["boundary"] == ("POST_REPLAY" if on_decode else "IN_REPLAY")  # dsv4 vs trtllm


def test_every_registry_name_is_a_backend(matrix: tuple[dict[str, str], dict[str, Any]]) -> None:
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    _, data = matrix
    backends = {r["backend"] for r in data["rows"]}
    assert {f"sglang_{name}" for name in ATTENTION_BACKENDS} <= backends
    # The reference engine's own backends are there beside sglang's, under their own names.
    assert {"trtllm_mha", "deepseek_v4", "sglang_trtllm_mha", "sglang_dsv4"} <= backends


def test_sglang_cells_pair_only_with_sglang_algorithms(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    _, data = matrix
    for row in data["rows"]:
        sglang_backend = row["backend"].startswith("sglang_")
        sglang_algorithm = row["algorithm"].startswith("sglang_")
        assert row["algorithm"] == "none" or sglang_backend == sglang_algorithm, row


def test_each_algorithms_prefill_gate_is_sglangs(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    _, data = matrix
    gates = {
        r["algorithm"]: r
        for r in data["rows"]
        if r["backend"] == "sglang_trtllm_mha" and r["mode"] == "EXTEND"
    }
    for name, row in gates.items():
        algo = algorithm(name)
        assert row["publish_phase"] is algo.supports_prefill_shared_read_done(), row
        assert "sglang" in row["publish_source"], row
        # trtllm_mha declares PRE_REPLAY: the record point is exactly the gate.
        assert row["record_point"] == ("pre_replay" if row["publish_phase"] else "none"), row
    assert {n for n, r in gates.items() if r["publish_phase"]} == {
        "none",
        "sglang_dflash",
        "sglang_dspark",
    }


def test_event_owners_are_the_real_workers(
    matrix: tuple[dict[str, str], dict[str, Any]],
) -> None:
    _, data = matrix
    owners = {r["algorithm"]: (r["event_owner"], r["event_owner_source"]) for r in data["rows"]}
    assert owners["sglang_eagle"] == ("draft", "plugin:sglang")  # EAGLEWorkerV2
    assert owners["sglang_standalone"] == ("draft", "plugin:sglang")
    assert owners["sglang_frozen_kv_mtp"] == ("draft", "plugin:sglang")
    assert owners["sglang_dflash"] == ("target", "plugin:sglang")  # BaseSpecWorker
    assert owners["sglang_dspark"] == ("target", "plugin:sglang")
    assert owners["none"] == ("target", "plugin:sglang+warcore")  # TpModelWorker, and the core
    # UnoWorkerV2 needs flashinfer, which a CPU build lacks: its owner cannot be asked here,
    # which is a failure (no owner: the coarse barrier), never the core's default target.
    assert owners["sglang_uno"] == (None, "default:failed:sglang")


def test_staged_multi_layer_eagle_owner_is_the_target() -> None:
    done = warcore_cli("matrix", "--json", "--draft-extend-staged")
    rows = json.loads(done.stdout)["rows"]
    owner = next(r for r in rows if r["algorithm"] == "sglang_eagle")
    assert (owner["event_owner"], owner["event_owner_source"]) == ("target", "plugin:sglang")


def test_check_names_the_owners_it_cannot_ask_and_notes_reference_differences() -> None:
    done = warcore_cli("check", check=False)
    lines = done.stdout.splitlines()
    # The one problem on a CPU: the workers of uno (flashinfer) and ngram (sgl_kernel) cannot be
    # imported, so their event owners are failures (coarse), each named; nothing else.
    problems = [
        line
        for line in lines
        if not line.startswith(("note:", "staging:", "engine:", "ok", "problems:"))
    ]
    # the release in force, named (an audited one: its entry)
    assert f"engine: sglang {RELEASE.version} installed: audited, its entry in force" in lines
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(problems) == 2, problems
    for algo, module in (("sglang_ngram", "sgl_kernel"), ("sglang_uno", "flashinfer")):
        assert any(
            f"worker for {algo} cannot be imported here" in p and module in p for p in problems
        ), problems
    notes = [line for line in lines if line.startswith("note:")]
    # Documented in the reference plugins' docstrings: deepseek_v4's static prefill is its
    # per-batch PRE_REPLAY (sglang's static one is UNKNOWN); trtllm_mha audits its own
    # draft-extend (sglang 0.5.23 declares nothing there).
    assert any("'deepseek_v4' models 'sglang_dsv4'" in n and "EXTEND" in n for n in notes), notes
    assert any(
        "'trtllm_mha' models 'sglang_trtllm_mha'" in n and "DRAFT_EXTEND_V2" in n for n in notes
    ), notes
