"""The shape gate on sglang 0.5.23's real modules: the audited table is the installed wheel's,
the live functions digest as their source does, and every cell the activation answers is never
earlier than sglang's own answer for it."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import warcore_sglang
from _cells import cells
from warcore_sglang._names import AUDITED, SRT, SUPPORTED
from warcore_sglang.activation import _shape

from warcore.audit import engine_code

_ORDER = ("PRE_REPLAY", "IN_REPLAY", "POST_REPLAY", "UNKNOWN")


def test_the_audited_table_is_the_installed_wheels() -> None:
    """Recomputed from the source files of the sglang this environment installs (0.5.23)."""
    assert SUPPORTED == "sglang===0.5.23"
    assert _shape.audit_table("0.5.23") == AUDITED["0.5.23"]


def test_a_live_function_digests_as_its_source_does() -> None:
    """The gate digests the live functions; the table digests the source files: the same."""
    checked = 0
    for module_name, functions in AUDITED["0.5.23"].items():
        try:
            module = importlib.import_module(SRT + module_name)
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
    pm: Any,
) -> None:
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
    # (sglang 0.5.23 closes it in the publisher that follows).
    for key in differ:
        point, _backend, algo, mode, *_ = key.split("\t")
        none_mode = algo == "none" and mode not in ("DECODE", "EXTEND")
        closed_prefill = point.startswith("prefill(") and gates[algo] == "False"
        assert none_mode or closed_prefill, key
    assert differ  # the documented differences are there


@pytest.mark.parametrize("module_name", sorted(AUDITED["0.5.23"]))
def test_each_audited_module_passes_its_gate_as_installed(module_name: str) -> None:
    try:
        module = importlib.import_module(SRT + module_name)
    except ImportError:
        pytest.skip(f"{module_name} needs a GPU build's import")
    check = _shape.MODULE_CHECKS.get(module.__name__)
    if check is not None:
        check(module)
    _shape.check_audited(module, "0.5.23")
