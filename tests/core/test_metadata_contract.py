"""Following the metadata contract is declared, never inherited.

A backend that a plugin registers and that nobody declares for ``DECODE`` or
``TARGET_VERIFY`` is ``UNKNOWN`` there (``default:no-answer``, the coarse fence), whatever
class it derives from: ``LiveReader`` below has ``torch_native``'s code but reads
``req_to_token`` in every layer of its forward (the shape of sglang's own ``torch_native``,
``layers/attention/torch_native_backend.py:139``), so an inherited ``IN_REPLAY`` would be an
early record point. ``BackendSpec(..., follows_contract=CONTRACT_MODES)`` is the one line that
opts a backend in: shown with its provenance (``contract:<plugin>``), audited by the
sanitizer like any declaration, and ``warcore check`` notes each backend that runs coarse only
for lack of it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
import torch
from _support.audit import TINY_MODEL
from _support.fake_dists import FakeDists, run_warcore

from warcore import (
    CONTRACT_MODES,
    BackendSpec,
    BoundaryContext,
    Execution,
    ForwardMode,
    RecordPoint,
    RunnerKind,
    SharedReadBoundary,
    hookimpl,
    resolve_shared_read_boundary,
)
from warcore.attention.torch_native import TorchNativeBackend
from warcore.audit.matrix import build_matrix, find_notes, find_problems
from warcore.audit.sanitizer import sanitize
from warcore.core import WarcorePluginManager, decide
from warcore.testing import make_plugin_manager

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

M, B, P = ForwardMode, SharedReadBoundary, RecordPoint
PLUGIN = "wctest_backends"
SMALL: dict[str, Any] = {"requests": 3, "max_running": 2, "model": TINY_MODEL}


class LiveReader(TorchNativeBackend):
    """torch_native's code, but its forward re-reads the live page table in every layer."""

    name = "wctest_live_reader"

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: Any
    ) -> torch.Tensor:
        self.gather_page_table(batch)  # a shared read during the replay
        return super().forward(layer, q, k, v, batch)


class Honest(TorchNativeBackend):
    """torch_native's code and reads under another name."""

    name = "wctest_honest"


class Offers:
    """A third-party plugin offering ``backend``; it declares nothing for it."""

    def __init__(
        self, backend: type[TorchNativeBackend], follows_contract: Collection[ForwardMode] = ()
    ) -> None:
        self.backend, self.follows_contract = backend, follows_contract

    @hookimpl
    def warcore_attention_backends(self) -> list[BackendSpec]:
        # The spec a plugin author writes: the contract line only where it is claimed.
        claim: dict[str, Any] = {"follows_contract": self.follows_contract}
        if not self.follows_contract:
            claim = {}
        return [BackendSpec(self.backend.name, self.backend, "a torch_native subclass", **claim)]


class DeclaresDecode:
    @hookimpl
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode
    ) -> SharedReadBoundary | None:
        return B.POST_REPLAY if (backend, forward_mode) == (LiveReader.name, M.DECODE) else None


def _pm(*plugins: object) -> WarcorePluginManager:
    pm = make_plugin_manager()
    for k, plugin in enumerate(plugins):
        pm.register(plugin, name=PLUGIN if k == 0 else f"wctest_declares_{k}")
    return pm


def _decision(pm: WarcorePluginManager, backend: Any, mode: ForwardMode) -> Any:
    context = BoundaryContext("dflash" if mode is M.TARGET_VERIFY else "none")
    return decide(pm, RunnerKind.DECODE, backend, mode, context, Execution.GRAPH_PLANTED)


@pytest.mark.plugins("dflash")
@pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY])
def test_an_undeclared_backend_is_unknown_whatever_class_it_derives_from(mode: ForwardMode) -> None:
    pm = make_plugin_manager(entry_points=["dflash"])
    pm.register(Offers(LiveReader), name=PLUGIN)
    built: TorchNativeBackend = LiveReader.__new__(LiveReader)  # no pool: only resolved
    for backend in (LiveReader.name, built):  # by name, or built
        resolved = resolve_shared_read_boundary(backend, mode, pm=pm)
        assert (resolved.boundary, resolved.source) == (B.UNKNOWN, "default:no-answer")
        d = _decision(pm, backend, mode)
        assert (d.record_point, d.source) == (P.NONE, "default:no-answer")
    # An AttentionBackend nobody registers gets nothing either.
    unregistered = Honest.__new__(Honest)
    assert resolve_shared_read_boundary(unregistered, mode).boundary is B.UNKNOWN


def test_the_declared_contract_shows_its_provenance_and_its_plugin() -> None:
    pm = _pm(Offers(Honest, follows_contract=CONTRACT_MODES))
    for mode in CONTRACT_MODES:
        resolved = resolve_shared_read_boundary(Honest.name, mode, pm=pm)
        assert (resolved.boundary, resolved.source) == (B.IN_REPLAY, f"contract:{PLUGIN}")
    cells = {
        (r.mode, r.algorithm): r.as_dict() for r in build_matrix(pm) if r.backend == Honest.name
    }
    decode = cells[(M.DECODE, "none")]
    assert (decode["boundary"], decode["boundary_source"]) == ("IN_REPLAY", f"contract:{PLUGIN}")
    assert decode["record_point"] == "in_graph_node"
    # The contract covers the captured graph only: an eager decode records after the forward,
    # and other modes are not the contract's.
    eager = decide(pm, RunnerKind.DECODE, Honest.name, M.DECODE, BoundaryContext(), Execution.EAGER)
    assert (eager.record_point, eager.source) == (P.POST_REPLAY, "default:eager")
    assert cells[(M.DRAFT_EXTEND_V2, "eagle")]["boundary_source"] == "default:no-answer"
    # Declared for decode only: verify stays unknown.
    pm = _pm(Offers(Honest, follows_contract={M.DECODE}))
    assert resolve_shared_read_boundary(Honest.name, M.TARGET_VERIFY, pm=pm).boundary is B.UNKNOWN


def test_the_sanitizer_audits_a_contract_declaration_like_any_other() -> None:
    # Undeclared, the backend that reads during the replay runs coarse: nothing published,
    # nothing unsound (it used to inherit IN_REPLAY and to read after its record point).
    undeclared = sanitize(LiveReader.name, "none", pm=_pm(Offers(LiveReader)), **SMALL)
    assert undeclared.sound and undeclared.checked == 0, undeclared.format()
    # Declaring the contract for it is a claim the sanitizer refutes, naming who made it.
    claim = sanitize(
        LiveReader.name, "none", pm=_pm(Offers(LiveReader, follows_contract=CONTRACT_MODES)),
        **SMALL,
    )  # fmt: skip
    v = claim.violation
    assert v is not None, claim.format()
    assert (v.forward_mode, v.declared, v.declared_by) == (
        M.DECODE,
        B.IN_REPLAY,
        f"contract:{PLUGIN}",
    )
    assert f"contract:{PLUGIN}" in v.describe()
    # An honest declaration passes the same audit.
    honest = sanitize(
        Honest.name, "none", pm=_pm(Offers(Honest, follows_contract=CONTRACT_MODES)), **SMALL
    )
    assert honest.sound and honest.checked > 0, honest.format()


def test_check_notes_each_backend_coarse_only_for_lack_of_a_declaration() -> None:
    pm = _pm(Offers(LiveReader))
    notes = [n for n in find_notes(pm) if LiveReader.name in n]
    assert len(notes) == 1, notes
    note = notes[0]
    assert note.startswith(f"note: backend {LiveReader.name!r} (plugin {PLUGIN!r})")
    assert "DECODE and TARGET_VERIFY" in note
    assert "follows_contract=warcore.CONTRACT_MODES" in note
    assert f"warcore sanitize --backend {LiveReader.name}" in note
    assert not [p for p in find_problems(pm) if LiveReader.name in p]  # a note, not a problem
    # A plugin declares its decode: the note names only the mode still undeclared.
    pm = _pm(Offers(LiveReader), DeclaresDecode())
    (note,) = [n for n in find_notes(pm) if LiveReader.name in n]
    assert (
        "runs TARGET_VERIFY on" in note and "follows_contract={ForwardMode.TARGET_VERIFY}" in note
    )
    # Declared: no note. Nor for the built-in backends, which declare it.
    assert not [n for n in find_notes(_pm(Offers(Honest, CONTRACT_MODES))) if "follows_" in n]


@pytest.mark.plugins("trtllm_mha", "deepseek_v4", "dflash")
def test_the_built_in_backends_declare_it_and_keep_their_record_points() -> None:
    pm = make_plugin_manager(entry_points=["trtllm_mha", "deepseek_v4", "dflash"])
    for backend, mode, point, source in [
        ("torch_native", M.DECODE, P.IN_GRAPH_NODE, "contract:warcore"),
        ("torch_native", M.TARGET_VERIFY, P.IN_GRAPH_NODE, "contract:warcore"),
        ("trtllm_mha", M.DECODE, P.IN_GRAPH_NODE, "contract:trtllm_mha"),
        ("trtllm_mha", M.TARGET_VERIFY, P.IN_GRAPH_NODE, "contract:trtllm_mha"),
        ("deepseek_v4", M.DECODE, P.IN_GRAPH_NODE, "contract:deepseek_v4"),
        # Its verify re-reads the page table in every layer: declared, not the contract's.
        ("deepseek_v4", M.TARGET_VERIFY, P.POST_REPLAY, "plugin:deepseek_v4"),
    ]:
        d = _decision(pm, backend, mode)
        assert (d.record_point, d.declared.source) == (point, source), (backend, mode)
    assert not [n for n in find_notes(pm) if "follows_contract" in n]


def test_a_contract_declaration_is_checked_where_it_is_written() -> None:
    def make(**kwargs: Any) -> Any:
        raise RuntimeError("not built")

    with pytest.raises(ValueError, match="'wctest_x': follows_contract names EXTEND"):
        BackendSpec("wctest_x", make, follows_contract={M.EXTEND})
    with pytest.raises(TypeError, match="'wctest_x': follows_contract must be a collection"):
        BackendSpec("wctest_x", make, follows_contract=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'wctest_x': a wrapper"):
        BackendSpec("wctest_x", make, children_for=lambda m, c: (), follows_contract={M.DECODE})
    spec = BackendSpec("wctest_x", make, follows_contract=["DECODE", "target_verify"])
    assert spec.follows_contract == CONTRACT_MODES


UNDECLARED = """
import warcore
from warcore import BackendSpec


def _make(**kwargs):
    from warcore.attention.torch_native import TorchNativeBackend

    return type("Unaudited", (TorchNativeBackend,), {"name": "wctest_unaudited"})(**kwargs)


@warcore.hookimpl
def warcore_attention_backends():
    return [BackendSpec("wctest_unaudited", _make, "a backend nobody audited")]
"""


@pytest.mark.plugin_agnostic
def test_warcore_check_prints_the_note_and_still_passes(fake: FakeDists) -> None:
    fake.add("wctest_unaudited", UNDECLARED)
    check = run_warcore("check", env=fake.env(WARCORE_PLUGINS="wctest_unaudited"))
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert lines[-1] == "ok", lines
    notes = [line for line in lines if line.startswith("note: backend 'wctest_unaudited'")]
    assert len(notes) == 1 and "follows_contract=warcore.CONTRACT_MODES" in notes[0], lines
    matrix = run_warcore("matrix", env=fake.env(WARCORE_PLUGINS="wctest_unaudited"))
    rows = [line.split() for line in matrix.stdout.splitlines()]
    decode = next(r for r in rows if r[:3] == ["wctest_unaudited", "DECODE", "none"])
    assert decode[3:5] == ["UNKNOWN", "default:no-answer"], decode
    native = next(r for r in rows if r[:3] == ["torch_native", "DECODE", "none"])
    assert native[3:5] == ["IN_REPLAY", "contract:warcore"], native
