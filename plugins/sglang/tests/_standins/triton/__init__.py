"""Import-only stand-in for ``triton`` (test support for warcore-sglang on a CPU-only machine).

sglang 0.5.23 imports triton at module level (``sglang/srt/utils/common.py`` and the kernel
modules) to *define* kernels; nothing here ever compiles or launches one. The idea is sglang's
own macOS stand-in (``sglang/_platform_stubs.py``): every attribute is a mock module, names
that look like classes are subclassable stub classes, calling a mock is a pass-through
decorator, and a meta-path finder answers any ``import triton.x.y``.

``plugins/sglang/tests/_boot/sitecustomize.py`` serves it only where no real triton is
installed (put ``_boot`` on ``PYTHONPATH``, or load it, before importing sglang). Never install
it: the real triton must win wherever it exists.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

__version__ = "3.0.0"
STANDIN = True  # lets a test tell the stand-in from the real package


class _StubBase:
    """A base class that any mock class attribute can be subclassed from."""


def _stub_class(name: str, module: str) -> type:
    return type(name, (_StubBase,), {"__module__": module})


class _MockModule(types.ModuleType):
    """A module whose every attribute is a child mock module or a stub class."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__package__ = name
        self.__file__ = __file__
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        if full in sys.modules:
            return sys.modules[full]
        if name[:1].isupper():
            value: Any = _stub_class(name, self.__name__)
        else:
            value = _make(full)
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # @triton.jit
        return lambda fn: fn  # @triton.jit(...), @triton.autotune(...)

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, item: object) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<triton stand-in {self.__name__!r}>"


def _make(name: str) -> _MockModule:
    mod = _MockModule(name)
    sys.modules[name] = mod
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is not None:
        setattr(parent, child, mod)
    return mod


class _Finder:
    """Answers ``import triton.<anything>`` with a stand-in module (finder and loader)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("triton."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        return sys.modules.get(spec.name) or _make(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 1


class Config:
    """Stand-in for ``triton.Config`` as used by ``@triton.autotune``."""

    def __init__(self, kwargs: Any = None, num_warps: int = 4, num_stages: int = 2, **_: Any):
        self.kwargs = kwargs or {}
        self.num_warps = num_warps
        self.num_stages = num_stages


def _triton_key() -> str:
    return "triton-standin"


def __getattr__(name: str) -> Any:  # attributes this file does not define
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    full = f"{__name__}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if name[:1].isupper():
        value: Any = _stub_class(name, __name__)
        globals()[name] = value
        return value
    return _make(full)


def jit(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


autotune = heuristics = jit

# Submodules whose contents are used as classes or constants at import time (sglang, and torch
# 2.13's inductor when it probes triton).
if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())

language = _make(f"{__name__}.language")


class _constexpr:
    def __init__(self, value: Any = None) -> None:
        self.value = value


language.constexpr = _constexpr  # type: ignore[attr-defined]
language.jit = jit  # type: ignore[attr-defined]
_make(f"{__name__}.language.extra.libdevice")

runtime = _make(f"{__name__}.runtime")
_jit_mod = _make(f"{__name__}.runtime.jit")
_jit_mod.JITFunction = _stub_class("JITFunction", _jit_mod.__name__)  # type: ignore[attr-defined]
_jit_mod.KernelInterface = _stub_class(  # type: ignore[attr-defined]
    "KernelInterface", _jit_mod.__name__
)
_cache_mod = _make(f"{__name__}.runtime.cache")
_cache_mod.triton_key = _triton_key  # type: ignore[attr-defined]
_autotuner = _make(f"{__name__}.runtime.autotuner")
_autotuner.OutOfResources = type("OutOfResources", (Exception,), {})  # type: ignore[attr-defined]
_autotuner.PTXASError = type("PTXASError", (Exception,), {})  # type: ignore[attr-defined]
_compiler_mod = _make(f"{__name__}.compiler.compiler")
_compiler_mod.triton_key = _triton_key  # type: ignore[attr-defined]
