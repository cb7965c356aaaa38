"""The shape gate on the installed sglang release's real modules: its entry's table is the
installed wheel's, the live functions digest as their source does, every watched module passes
its checks as installed, and every cell the activation answers is never earlier than that
release's own answer for it."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import warcore_sglang
from _cells import cells
from _release import RELEASE, VERSION
from warcore_sglang.activation import _state
from warcore_sglang.declarations import oracle

from warcore.integration import engine_code

_ORDER = ("PRE_REPLAY", "IN_REPLAY", "POST_REPLAY", "UNKNOWN")
_IMPORTED_ELSEWHERE = ("sglang.srt.ray.", "sglang.srt.disaggregation.mooncake.")


def test_the_audited_table_is_the_installed_wheels() -> None:
    """Recomputed from the source files of the sglang this environment installs."""
    assert oracle.scope() == f"sglang==={VERSION}"
    for module, functions in RELEASE.functions.items():
        try:
            found = engine_code.audit_module_source(module, functions)
        except ImportError:  # sglang.srt.ray's package imports Ray, the Mooncake connector's
            # prometheus_client and the transfer engine (nox -s sglang_pd has them), maybe
            # absent here: their rows are read from the wheels (tests/cli/test_release.py:
            # each audited wheel against its entry)
            assert module.startswith(_IMPORTED_ELSEWHERE), module
            continue
        table = {q: (sig, code if functions[q][1] else "") for q, (sig, code) in found.items()}
        assert table == functions, module


def test_a_live_function_digests_as_its_source_does() -> None:
    """The gate digests the live functions; the table digests the source files: the same."""
    checked = 0
    for module_name, functions in RELEASE.functions.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # uno's worker: flashinfer, not on a CPU
        for qualname, (sig, code) in functions.items():
            function = engine_code.resolve(module, qualname)
            assert engine_code.signature(function) == sig, qualname
            if code:
                assert engine_code.digest(function) == code, qualname
                checked += 1
    assert checked >= 12


def test_the_writers_of_the_in_graph_marker_are_sglangs_own() -> None:
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    assert engine_code.assigns(DecodeCudaGraphRunner, "in_graph_metadata_prep_done") == {
        "__init__",
        "_record_in_graph_metadata_prep_done",
    }
    for sub in DecodeCudaGraphRunner.__subclasses__():  # eagle's, frozen-kv's, ...: none
        assert not engine_code.assigns(sub, "in_graph_metadata_prep_done"), sub


def _value(answer: str) -> int:
    return _ORDER.index(answer)


def test_every_cell_is_never_earlier_than_sglangs_own_and_differs_only_where_documented(
    pm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the prefill opt-in on (0.5.21's and 0.5.22's default: off), so that sglang's own prefill
    # decision has cells to show
    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "1")
    own = cells()
    warcore_sglang.install()
    try:
        ours = cells()
    finally:
        warcore_sglang.uninstall()
    assert cells() == own  # uninstalled: sglang's own again
    assert ours.keys() == own.keys() and len(own) > 3000
    gates = {key.split("\t")[1]: value for key, value in own.items() if key.startswith("prefill_")}
    differ = {}
    for key, answer in ours.items():
        mine = own[key]
        point, *rest = key.split("\t")
        if answer == mine:
            continue
        differ[key] = (mine, answer)
        if point == "prefill_gate":
            assert (mine, answer) == ("True", "False"), key  # a "no" never becomes a "yes"
        elif point == "owner":
            assert answer == "none", key  # never another runner than sglang's
        else:
            assert answer in _ORDER and mine in _ORDER, key
            assert _value(answer) > _value(mine), key  # later, never earlier
    # Where they differ, and why (docs/sglang.md): the core's 'none' publishes only at DECODE
    # and EXTEND; an algorithm whose prefill gate is off closes its prefill in the resolver
    # (sglang 0.5.23 closes it in the publisher that follows); 0.5.21's decode runner answers
    # an unmarked IN_REPLAY with PRE_REPLAY, warcore with POST_REPLAY; its EAGLE draft-extend
    # owner publishes undeclared, so that step is coarse.
    for key in differ:
        point, _backend, algo, mode, *_ = key.split("\t")
        none_mode = algo == "none" and mode not in ("DECODE", "EXTEND")
        closed_prefill = point.startswith("prefill(") and gates[algo] == "False"
        unmarked = point == "decode(planted=False)" and differ[key] == ("PRE_REPLAY", "POST_REPLAY")
        demoted = unmarked and RELEASE.decode_unmarked == "PRE_REPLAY"
        undeclared_owner = point == "owner" and differ[key][0] in RELEASE.unbounded_owners
        assert none_mode or closed_prefill or demoted or undeclared_owner, key
    assert differ  # the documented differences are there


@pytest.mark.parametrize("module_name", sorted({*RELEASE.functions, *RELEASE.watched}))
def test_each_audited_module_passes_its_gate_as_installed(module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        pytest.skip(f"{module_name} needs a GPU build's import")
    warcore_sglang.install()  # the activation in force checks with the installed entry
    try:
        _state.activation.check_module(module)
    finally:
        warcore_sglang.uninstall()
