"""The WAR surface's extractors on small sources (:mod:`warcore.integration.surface`): what each
reads, what Python runs (the last binding), and the file it is kept in. The real wheels'
surfaces: tests/cli/test_release.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from warcore.integration import surface
from warcore.integration.surface import (
    Branches,
    ClassMembers,
    Constructions,
    Definers,
    EnumMembers,
    References,
    Registry,
    StepRunners,
    Switches,
)
from warcore.integration.wheel import SourceTree

pytestmark = pytest.mark.isolated


def _tree(**modules: str) -> SourceTree:
    sources = {name.replace("__", "."): textwrap.dedent(text) for name, text in modules.items()}
    return SourceTree(sources, frozenset())


BACKENDS = """
class Base:
    def shared_read_ends(self, fm):
        return 1

class Twice(Base):
    def shared_read_ends(self, fm):
        return 2
    def shared_read_ends(self, fm):  # Python binds this one
        return 3

class Assigned(Base):
    shared_read_ends = Base.shared_read_ends

class Silent(Base):
    pass
"""


def test_definers_name_every_class_binding_a_point_at_its_last_binding() -> None:
    tree = _tree(eng__backends=BACKENDS)
    found = Definers("points", ("shared_read_ends",)).extract(tree)
    assert set(found) == {
        "eng.backends:Base.shared_read_ends",
        "eng.backends:Twice.shared_read_ends",
        "eng.backends:Assigned.shared_read_ends",
    }
    last = BACKENDS.replace("        return 2\n", "        return 4\n")
    assert Definers("points", ("shared_read_ends",)).extract(_tree(eng__backends=last)) == found
    changed = BACKENDS.replace("return 3", "return 5")
    again = Definers("points", ("shared_read_ends",)).extract(_tree(eng__backends=changed))
    assert {k for k in found if found[k] != again[k]} == {"eng.backends:Twice.shared_read_ends"}


LOOP = """
class Mixin:
    def loop(self):
        while True:
            batch = self.get()
            if batch:
                self.run(batch)
                self._apply_war_barrier()
            if self.model_worker.last_shared_read_runner.shared_read_done_event is None:
                continue

    def quiet(self):
        return self.get()
"""


def test_references_give_each_use_in_order_with_compound_headers() -> None:
    found = References("readers", ("_apply_war_barrier", "shared_read_done_event")).extract(
        _tree(eng__loop=LOOP)
    )
    assert found == {
        "eng.loop:Mixin.loop": "self._apply_war_barrier() | "
        "if self.model_worker.last_shared_read_runner.shared_read_done_event is None:"
    }


ENVIRON = """
class EnvBool:
    def __init__(self, default): ...

class Envs:
    SGLANG_ENABLE_WAR_BARRIER = EnvBool(False)
    SGLANG_WARMUP_TIMEOUT = EnvBool(True)
    SGLANG_ENABLE_PREFILL_WAR_READ_DONE: EnvBool = EnvBool(True)
"""


def test_switches_read_each_matching_name_with_its_default() -> None:
    found = Switches("switches", "eng.environ", "Envs", r"(^|_)WAR(_|$)").extract(
        _tree(eng__environ=ENVIRON)
    )
    assert found == {
        "SGLANG_ENABLE_WAR_BARRIER": "EnvBool(False)",
        "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "EnvBool(True)",
    }


def test_enum_members_and_class_members() -> None:
    enum = "from enum import IntEnum, auto\nclass Mode(IntEnum):\n    A = auto()\n    B = auto()\n"
    assert EnumMembers("modes", "eng.m", "Mode").extract(_tree(eng__m=enum)) == {
        "A": "1",
        "B": "2",
    }
    pool = "class Pool:\n    def copy(self, x):\n        return x\n    depth = 2\n"
    assert set(ClassMembers("ring", "eng.p", "Pool").extract(_tree(eng__p=pool))) == {
        "Pool.copy",
        "Pool.depth",
    }


REGISTRY = """
from eng.backends import Base, Twice

REGISTRY = {"base": Base, "twice": Twice}
BACKENDS = {}

def register(name):
    def decorator(fn):
        BACKENDS[name] = fn
        return fn
    return decorator

@register("local")
def create_local(runner):
    if runner.mla:
        from eng.mla import MlaBackend

        return MlaBackend(runner)
    return Base(runner)
"""


def test_registry_reads_a_dict_literal_and_decorated_factories() -> None:
    tree = _tree(eng__backends=BACKENDS, eng__registry=REGISTRY)
    literal = Registry("registry", "eng.registry", name="REGISTRY").extract(tree)
    assert literal == {"base": "eng.backends:Base", "twice": "eng.backends:Twice"}
    decorated = Registry("registry", "eng.registry", decorator="register").extract(tree)
    assert decorated == {"local": "eng.mla:MlaBackend | eng.backends:Base"}


USERS = """
from eng.buffers import StagedWriteTensor, UvaBackedTensor

class Processor:
    def __init__(self, n):
        self.sizes = UvaBackedTensor(n)
        self.rows = StagedWriteTensor((n, 3))

def helper(n):
    return UvaBackedTensor(n)
"""


def test_constructions_are_grouped_by_owner() -> None:
    found = Constructions("users", ("UvaBackedTensor", "StagedWriteTensor")).extract(
        _tree(eng__users=USERS)
    )
    assert found == {
        "eng.users:Processor": "UvaBackedTensor(n) | StagedWriteTensor((n, 3))",
        "eng.users:helper": "UvaBackedTensor(n)",
    }


WARMUPS = """
import torch

def synced(execute, sample):
    for _ in range(2):
        execute(None)
        sample(None)
        torch.accelerator.synchronize()

def back_to_back(execute, sample):
    for _ in range(2):
        execute(None)
        sample(None)

def hands_on(execute, sample):
    synced(execute, sample)

def unrelated(x):
    torch.accelerator.synchronize()
"""


def test_step_runners_say_steps_waits_and_loops_in_order() -> None:
    found = StepRunners("warmups", ("execute", "sample"), ("synchronize",)).extract(
        _tree(eng__warmup=WARMUPS)
    )
    assert found == {
        "eng.warmup:synced": "loop[step execute, step sample, wait synchronize]",
        "eng.warmup:back_to_back": "loop[step execute, step sample]",
        "eng.warmup:hands_on": "via synced",
    }


CONFIG = """
class Config:
    @property
    def depth(self):
        pp = self.pp
        if self.async_scheduling:
            return pp + 1
        return pp
"""


def test_branches_put_each_return_under_its_conditions() -> None:
    found = Branches("depth", "eng.config", "Config.depth").extract(_tree(eng__config=CONFIG))
    assert found == {"if self.async_scheduling": "pp + 1", "not self.async_scheduling": "pp"}


def test_differences_and_the_file_round_trip(tmp_path: Path) -> None:
    old = {"registry": {"a": "A", "gone": "G"}, "modes": {"X": "1"}}
    new = {"registry": {"a": "A2", "new": "N"}, "modes": {"X": "1"}}
    found = surface.differences(old, new)
    assert [(d.key, d.kind) for d in found] == [
        ("a", "changed"),
        ("gone", "removed"),
        ("new", "added"),
    ]
    assert found[0].line() == "registry: a changed: A -> A2"
    path = tmp_path / "1.0.json"
    path.write_text(surface.dump(new, engine="eng", version="1.0"))
    assert surface.load(path) == (new, {"engine": "eng", "version": "1.0"})
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"1\.0\.json: not a surface file"):
        surface.load(path)


def test_a_source_too_deep_to_read_is_an_entry_saying_so() -> None:
    """An attribute chain Python parses but no recursive reader follows (1500 deep): the
    section says it was not read, which differs from any recorded surface; no traceback."""
    deep = "def f(execute):\n    execute(x" + ".y" * 1500 + "())\n"
    found = surface.compute((StepRunners("warmups", ("execute",), ()),), _tree(eng__deep=deep))
    assert found == {"warmups": {"(not read)": "a source nested deeper than this reader follows"}}
    shallow = "def f(execute):\n    execute(x" + ".y" * 50 + "())\n"
    found = surface.compute((StepRunners("warmups", ("execute",), ()),), _tree(eng__deep=shallow))
    assert found == {"warmups": {"eng.deep:f": "step execute"}}


def test_the_base_surface_not_recorded_is_said_and_needs_a_review(tmp_path: Path) -> None:
    from warcore.integration.release_diff import compare_surface
    from warcore.integration.releases import Engine, Release

    base = Release("1.0", functions={}, watched={})
    spec = (EnumMembers("modes", "eng.m", "Mode"),)
    engine = Engine("eng", "eng", {"1.0": base}, __name__, surface=spec, surfaces=tmp_path)
    tree = _tree(eng__m="import enum\nclass Mode(enum.Enum):\n    A = 1\n")
    result = compare_surface(engine, tree, base)
    assert result is not None and result.unread == "not recorded"
    (tmp_path / "1.0.json").write_text(surface.dump(surface.compute(spec, tree)))
    result = compare_surface(engine, tree, base)
    assert result is not None and result.unread is None and result.differences == ()
    edited = _tree(eng__m="import enum\nclass Mode(enum.Enum):\n    A = 1\n    B = 2\n")
    result = compare_surface(engine, edited, base)
    assert result is not None
    assert [d.line() for d in result.differences] == ["modes: B added: 2"]
