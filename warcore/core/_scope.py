"""Implementation ranges of scoped declarations: is the audited code the code that runs?"""

from __future__ import annotations

import functools
import importlib.metadata as md

from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["installed_version", "parse_requirement", "stale_reason"]


@functools.lru_cache(maxsize=256)
def parse_requirement(text: str) -> Requirement:
    """``"sglang>=0.5.23,<0.6"`` as a Requirement; a malformed one names itself."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(
            f"invalid implementation range {text!r}: {exc} "
            "(write a distribution name and a version range, e.g. 'sglang>=0.5.23,<0.6')"
        ) from None
    if req.marker is not None or req.url is not None or req.extras:
        raise ValueError(f"implementation range {text!r}: only 'name' and a version range")
    return req


@functools.lru_cache(maxsize=256)
def installed_version(distribution: str) -> str | None:
    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def stale_reason(requirement: str) -> str | None:
    """``None`` when the installed implementation is inside the range, else why not."""
    req = parse_requirement(requirement)
    version = installed_version(req.name)
    if version is None:
        return f"{req.name} is not installed (declaration audited against {requirement})"
    if not req.specifier.contains(version, prereleases=True):
        return f"{req.name} {version} is installed (declaration audited against {requirement})"
    return None
