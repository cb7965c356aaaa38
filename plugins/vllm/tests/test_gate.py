"""The version gate is exact and the shape gate recomputes the audited digests from the
installed wheel."""

from __future__ import annotations

import ast

import pytest
from packaging.specifiers import SpecifierSet
from warcore_vllm import _names, _vllm
from warcore_vllm._variants import replaced, variant


def test_installed_is_the_audited_release() -> None:
    assert _vllm.installed_version() == _names.SUPPORTED == "0.33.0"
    assert _vllm.unsupported_reason() is None


@pytest.mark.parametrize("version", ["0.33.0+cpu", "0.33.0.post1", "0.33.0.1", "0.33.1", "0.33"])
def test_other_versions_are_refused(version: str) -> None:
    reason = _vllm.unsupported_reason(version)
    assert reason is not None and version in reason and "0.33.0" in reason


def test_packaging_equality_would_accept_a_local_build() -> None:
    # why the gate compares strings: PEP 440's == ignores the local label
    assert SpecifierSet("==0.33.0").contains("0.33.0+cpu")
    assert _vllm.unsupported_reason("0.33.0+cpu") is not None


def test_audited_digests_match_the_installed_wheel() -> None:
    assert _vllm.digests() == _names.AUDITED["0.33.0"]
    assert _vllm.gate_problems() == []


def test_a_changed_body_is_named() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    def always(node: ast.FunctionDef) -> None:
        node.body = [ast.Return(ast.Constant(True))]

    changed = variant(Scheduler, "_request_blocks_can_be_freed", always)
    with replaced(Scheduler, "_request_blocks_can_be_freed", changed):
        problems = _vllm.gate_problems()
    assert len(problems) == 1 and "Scheduler._request_blocks_can_be_freed" in problems[0]
    assert _vllm.gate_problems() == []
