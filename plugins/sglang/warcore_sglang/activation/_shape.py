"""The shape gate: what warcore-sglang relies on in an sglang module, checked before patching it.

The version allowlist (:data:`warcore_sglang._names.AUDITED`) cannot see an sglang whose code
moved under an audited version number (an editable checkout with stale metadata, a fork, an
image built with a pretended version). So each watched module is checked when it is patched:
the members and signatures warcore-sglang calls, the module globals and environment variables
it reads, and a digest of every sglang function body it wraps or relies on
(:func:`warcore.audit.engine_code.digest`: comments and formatting do not count). The audited
digests are stored beside the audited versions; ``tests/test_shape_gate.py`` recomputes them
from the installed wheel.

A check that fails raises :class:`ShapeMismatch` naming the check; the activation then passes
everything through to sglang (:func:`warcore_sglang.activation.install`). Pure inspection:
nothing here changes sglang.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import ModuleType

from warcore.audit.engine_code import (
    ShapeMismatch,
    assigns,
    audit_module_source,
    calls,
    check_functions,
    method_sources,
)

from .._names import AUDITED, SRT

__all__ = [
    "MODULE_CHECKS",
    "ShapeMismatch",
    "audit_table",
    "check_audited",
    "check_runner_class",
]

_ENDS = {"PRE_REPLAY": 1, "IN_REPLAY": 2, "POST_REPLAY": 3, "UNKNOWN": 4}
_ENV = ("SGLANG_FORCE_COARSE_WAR_BARRIER", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
_ALGORITHMS = frozenset(
    ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE")
)


def check_audited(module: ModuleType, version: str, owner: str = "") -> None:
    """Every audited function of ``module`` (of class ``owner`` only, when given) has its
    audited signature and digest under ``version``."""
    audited = AUDITED.get(version, {}).get(module.__name__.removeprefix(SRT), {})
    if owner:
        audited = {q: v for q, v in audited.items() if q.startswith(owner + ".")}
    check_functions(module, audited, version)


def _require(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise ShapeMismatch(check, detail)


def _check_base(module: ModuleType) -> None:
    ends = getattr(module, "SharedReadEnds", None)
    members = {k: v.value for k, v in getattr(ends, "__members__", {}).items()}
    _require(members == _ENDS, "SharedReadEnds members", f"{members}, audited {_ENDS}")
    _require(callable(getattr(ends, "max_of", None)), "SharedReadEnds.max_of", "missing")
    for name in ("envs", "ForwardMode", "AttentionBackend"):
        _require(hasattr(module, name), f"module global {name}", "missing")
    missing = [v for v in _ENV if not hasattr(module.envs, v)]
    _require(not missing, "environment variables", f"sglang's envs lacks {', '.join(missing)}")


def _check_spec_info(module: ModuleType) -> None:
    members = set(module.SpeculativeAlgorithm.__members__)
    _require(
        members == _ALGORITHMS,
        "SpeculativeAlgorithm members",
        f"{sorted(members ^ _ALGORITHMS)} differ from the audited {sorted(_ALGORITHMS)}",
    )


def _check_spec_registry(module: ModuleType) -> None:
    for name in ("_REGISTRY", "get_spec", "CustomSpecAlgo"):
        _require(hasattr(module, name), f"spec_registry.{name}", "missing")


def _check_decode_runner(module: ModuleType) -> None:
    runner = module.DecodeCudaGraphRunner
    _require(
        calls(runner.execute, "_resolve_shared_read_ends"),
        "DecodeCudaGraphRunner.execute",
        "no longer calls self._resolve_shared_read_ends(...)",
    )
    check_runner_class(runner)


_RESOLVE_CALL = re.compile(r"(?<!def )_resolve_shared_read_ends\(")
_RESOLVE_OWN_BACKEND = re.compile(r"_resolve_shared_read_ends\(\s*self\._replay_attn_backend\(\)")


def check_runner_class(cls: type) -> None:
    """What the patched decode resolution relies on in the decode runner and each subclass (the
    runner remembers its answers by mode alone): only sglang's own two methods plant the
    in-graph marker; ``attn_backend`` and ``enable_pdmux`` are set in ``__init__`` only; every
    call of ``_resolve_shared_read_ends`` passes ``self._replay_attn_backend()``, which no
    subclass redefines."""
    base = cls.__name__ == "DecodeCudaGraphRunner"
    marker = {"__init__", "_record_in_graph_metadata_prep_done"} if base else set()
    found = assigns(cls, "in_graph_metadata_prep_done")
    _require(
        found == marker,
        f"{cls.__qualname__}.in_graph_metadata_prep_done",
        f"assigned in {sorted(found)} (audited: only DecodeCudaGraphRunner's {sorted(marker)})",
    )
    for attr in ("attn_backend", "enable_pdmux"):
        found = assigns(cls, attr)
        _require(
            found <= {"__init__"},
            f"{cls.__qualname__}.{attr}",
            f"assigned in {sorted(found)} (audited: in __init__ only)",
        )
    _require(
        base or "_replay_attn_backend" not in vars(cls),
        f"{cls.__qualname__}._replay_attn_backend",
        "redefined (audited: DecodeCudaGraphRunner's own)",
    )
    for name, text in method_sources(cls).items():
        _require(
            len(_RESOLVE_CALL.findall(text)) == len(_RESOLVE_OWN_BACKEND.findall(text)),
            f"{cls.__qualname__}.{name}",
            "calls _resolve_shared_read_ends with another backend than self._replay_attn_backend()",
        )


def _check_model_runner(module: ModuleType) -> None:
    _require(
        "shared_read_done_event" not in vars(module.ModelRunner),
        "ModelRunner.shared_read_done_event",
        "is a class attribute (audited: a plain instance attribute)",
    )


MODULE_CHECKS: dict[str, Callable[[ModuleType], None]] = {
    SRT + "layers.attention.base_attn_backend": _check_base,
    SRT + "speculative.spec_info": _check_spec_info,
    SRT + "speculative.spec_registry": _check_spec_registry,
    SRT + "model_executor.runner.decode_cuda_graph_runner": _check_decode_runner,
    SRT + "model_executor.model_runner": _check_model_runner,
}
"""Structural checks beyond the audited functions, per module (the others have none)."""


def audit_table(version: str) -> dict[str, dict[str, tuple[str, str]]]:
    """The installed sglang's (signature, digest) of every function audited in ``version``
    (the digest ``""`` where that version records none), read from the source files."""
    table: dict[str, dict[str, tuple[str, str]]] = {}
    for module, functions in AUDITED[version].items():
        found = audit_module_source(SRT + module, functions)
        table[module] = {
            q: (sig, code if functions[q][1] else "") for q, (sig, code) in found.items()
        }
    return table


if __name__ == "__main__":  # pragma: no cover - prints the table to paste into _names.py
    base = sys.argv[1] if len(sys.argv) > 1 else next(iter(AUDITED))
    for module, functions in audit_table(base).items():
        print(f'        "{module}": {{')
        for qualname, (sig, code) in functions.items():
            print(f'            "{qualname}": ("{sig}", "{code}"),')
        print("        },")
