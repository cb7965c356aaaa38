"""Output files written whole or not at all, and a writability check that really tries.

A benchmark result, a trace or a plot is written into a temporary file beside its target and
renamed over it once complete: a write that fails or is interrupted (SIGINT, SIGTERM) leaves
the previous file, or none, never a half-written one that looks complete. Whether a file can be
written is found by creating (and removing) one, not with ``os.access``, which answers yes to
root where the file system still refuses (``/proc``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

__all__ = ["probe_writable", "replaced_on_success", "write_text"]


def _partial(target: Path) -> Path:
    """A fresh hidden name beside ``target``, ending in its suffix (matplotlib picks the
    format by it)."""
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}.part{target.suffix}")


def _create(path: Path) -> None:
    """Create ``path`` new and empty, with the permissions a plain ``open`` would give."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


@contextmanager
def replaced_on_success(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write to; on success it replaces ``path``, on any exception
    (``KeyboardInterrupt`` included) it is removed and ``path`` is left as it was. Missing
    folders are created. A ``path`` that exists and is not a regular file (``/dev/stdout``,
    a FIFO) is yielded itself: it cannot be renamed over."""
    target = Path(path)
    if target.exists() and not target.is_file():
        yield target
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    part = _partial(target)
    _create(part)
    try:
        yield part
        os.replace(part, target)
    except BaseException:
        with suppress(OSError):
            part.unlink()
        raise


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (see :func:`replaced_on_success`)."""
    with replaced_on_success(path) as part:
        part.write_text(text, encoding="utf-8")


def probe_writable(path: str | os.PathLike[str], *, make_parents: bool = False) -> None:
    """Raise :class:`OSError` unless a file can be written at ``path``: create a temporary file
    beside it (in its folder, which is where :func:`replaced_on_success` writes) and remove
    it. With ``make_parents``, missing folders are created to try and removed again. An existing
    ``path`` is not changed; one that is not a regular file (a device) is not tried."""
    target = Path(path)
    if target.exists() and not target.is_file():
        return
    made: list[Path] = []
    folder = target.parent
    while make_parents and not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        for new in reversed(made):
            new.mkdir()
        part = _partial(target)
        _create(part)
        part.unlink()
    finally:
        for new in made:
            with suppress(OSError):
                new.rmdir()
