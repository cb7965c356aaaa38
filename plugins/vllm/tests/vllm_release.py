"""Which vLLM release the tests run on, and what it has (imports nothing of vLLM)."""

from __future__ import annotations

import pytest

__all__ = ["requires", "unaudited"]


def unaudited() -> str | None:
    """Why the installed vLLM cannot be tested (``None``: it is an audited release)."""
    from warcore_vllm.gate import unsupported_reason

    reason = unsupported_reason()
    return None if reason is None else f"{reason}: warcore-vllm's tests need one of them"


def requires(check: str, configuration: str | None = None) -> pytest.MarkDecorator:
    """Skip unless the installed release's audit runs ``check`` (in ``configuration``)."""
    from warcore_vllm.gate import installed_version
    from warcore_vllm.releases import RELEASES

    version = installed_version()
    release = RELEASES.get(str(version))
    runs = release is not None and any(
        c == check and configuration in (None, key) for c, key in release.audits
    )
    where = f"[{configuration}]" if configuration else ""
    return pytest.mark.skipif(not runs, reason=f"vLLM {version} has no {check}{where} check")
