"""Import-only stand-in for ``torchvision`` (test support for warcore-sglang on a CPU machine).

sglang 0.5.23 imports torchvision at module level through ``sglang/srt/configs`` (e.g.
``configs/deepseek_ocr.py``: ``from torchvision.transforms import InterpolationMode``) even
when no multimodal model is served. The registry's torchvision is a CUDA build that fails to
load against a CPU torch, and transformers inspects the module, so this stand-in answers any
attribute and any ``import torchvision.x.y``: submodule-like names give a child stand-in
module, class-like names (``InterpolationMode``) give an empty class. Nothing here transforms
an image. ``plugins/sglang/tests/_boot/sitecustomize.py`` serves it only where no real
torchvision is installed; never install it.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+standin"
STANDIN = True


class _AnyMeta(type):
    """Class-like stand-ins answer any attribute too (``InterpolationMode.NEAREST_EXACT``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _AnyMeta(name, (_Any,), {"__module__": cls.__module__})
        setattr(cls, name, value)
        return value


class _Any(metaclass=_AnyMeta):
    """What a class-like attribute resolves to: subclassable, instantiable, attribute-rich."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)


class _StandinModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__package__ = name
        self.__file__ = __file__
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> Any:
        return _resolve(self.__name__, name, self.__dict__)

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self.__name__!r}>"


def _resolve(owner: str, name: str, namespace: dict[str, Any]) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    full = f"{owner}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    value: Any
    if name[:1].isupper():
        value = _AnyMeta(name, (_Any,), {"__module__": owner})
    elif name.startswith("_"):
        raise AttributeError(name)  # keep private probes (hasattr) honest
    else:
        value = _make(full)
    namespace[name] = value
    return value


def _make(name: str) -> _StandinModule:
    mod = _StandinModule(name)
    sys.modules[name] = mod
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name)
    if parent is not None:
        setattr(parent, child, mod)
    return mod


class _Finder:
    """Answers ``import torchvision.<anything>`` with a stand-in module (finder and loader)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        return sys.modules.get(spec.name) or _make(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def __getattr__(name: str) -> Any:
    return _resolve(__name__, name, globals())
