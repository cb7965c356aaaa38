"""One verdict of the audit: which check, on which vLLM class, in which configuration."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NOT_NEEDED", "SOUND", "VIOLATION", "Verdict"]

SOUND, VIOLATION, NOT_NEEDED = "sound", "VIOLATION", "not needed"


@dataclass(frozen=True)
class Verdict:
    check: str
    cls: str
    configuration: str
    verdict: str
    detail: str
    key: str = ""
    """The configuration as :attr:`warcore_vllm.releases.VllmRelease.audits` names it (where it
    differs from what the line shows)."""

    def line(self) -> str:
        return (
            f"{self.verdict:<10} {self.check:<16} {self.cls} [{self.configuration}]: {self.detail}"
        )
