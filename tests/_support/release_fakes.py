"""A fake engine integration and hand-made wheels for ``warcore release`` (issue 42's hostile
cases): small, built in a test's folder in milliseconds, so each case is its own exact
reproduction without the real 30-300 MB wheels.

:func:`engine_folder` writes a module holding an :class:`~warcore.integration.releases.Engine`
(``wctest_rel``, distribution ``wctest-rel``) and a ``.dist-info`` exposing it under
``warcore.integrations``; a ``warcore`` process with that folder on ``PYTHONPATH`` sees it.
:func:`wheel` writes a wheel of that distribution from ``{member: text}``; :func:`patched`
rewrites bytes of a member's headers (the encrypted flag, the compression method), as a
hostile file would have them.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from warcore.integration.engine_code import audit_in_source

ENGINE = "wctest_rel"
DIST = "wctest-rel"
MODULE = "wcrel.runner"
"""The relied-on module of every fake release (``wcrel/runner.py``)."""
AUDITED = """
class Runner:
    def execute(self, batch):
        return batch + 1


def get_spec(name):
    return {"name": name}
"""
"""The audited release's ``wcrel/runner.py``: its rows are what the fake engine relies on."""


def rows(source: str = AUDITED) -> dict[str, tuple[str, str]]:
    """The audited rows (signature, digest) of ``Runner.execute`` and ``get_spec`` in
    ``source``, as an integration records them."""
    return {q: audit_in_source(source, q) for q in ("Runner.execute", "get_spec")}


def engine_folder(root: Path, versions: tuple[str, ...] = ("1.0",)) -> Path:
    """A folder exposing the fake engine, one audited release per version (each relying on
    :data:`AUDITED`'s rows, watching :data:`MODULE`), to put first on ``PYTHONPATH``."""
    root.mkdir(parents=True, exist_ok=True)
    entries = ", ".join(
        f"Release({v!r}, {{{MODULE!r}: {rows()!r}}}, {{{MODULE!r}: 'runner'}})" for v in versions
    )
    (root / "_wcfake_release_engine.py").write_text(
        "from warcore.integration.releases import Engine, Release, by_version\n"
        f"ENGINE = Engine({ENGINE!r}, {DIST!r}, by_version([{entries}]), __name__)\n"
    )
    info = root / "warcore_fake_release-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: warcore-fake-release\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[warcore.integrations]\n{ENGINE} = _wcfake_release_engine:ENGINE\n"
    )
    return root


def wheel(folder: Path, members: dict[str, str | bytes], version: str = "1.0") -> Path:
    """A wheel of :data:`DIST` ``version`` holding ``members`` (deflated) and its
    ``.dist-info`` metadata."""
    path = folder / f"{DIST.replace('-', '_')}-{version}-py3-none-any.whl"
    info = f"{DIST.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        archive.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n"
        )
    return path


def bomb(folder: Path, member: str, mib: int, *, members: int = 1) -> Path:
    """A wheel of :data:`DIST` 1.0 whose ``member`` (``members`` of them: ``member`` with
    ``0``, ``1``... before ``.py``) each inflate to ``mib`` MiB of ``#``, about 1,000 times
    smaller deflated: a valid zip (its CRCs and sizes true), built in about a second. Each
    MiB deflates to the same bytes after a full flush, so zipfile's writer is handed those
    bytes (its compressor replaced) while it counts and checksums the real data."""
    chunk = b"#" * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)

    class _Repeat:
        def compress(self, data: bytes) -> bytes:
            return block

        def flush(self) -> bytes:
            return zlib.compressobj(9, zlib.DEFLATED, -15).flush()

    path = folder / f"{DIST.replace('-', '_')}-1.0-py3-none-any.whl"
    names = [member] if members == 1 else [member.replace(".py", f"{i}.py") for i in range(members)]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            with archive.open(name, "w", force_zip64=True) as file:
                file._compressor = _Repeat()  # type: ignore[attr-defined]
                for _ in range(mib):
                    file.write(chunk)
    return path


def patched(path: Path, member: str, *, flag_bits: int = 0, method: int | None = None) -> Path:
    """``path`` with ``member``'s local and central headers rewritten: ``flag_bits`` or-ed
    into its flags (1: encrypted), its compression method set to ``method``."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
        central = (
            archive.start_dir
            + sum(  # the member's central record
                46 + len(i.filename.encode()) + len(i.extra) + len(i.comment)
                for i in archive.infolist()[: archive.infolist().index(info)]
            )
        )
    for header, flags_at in ((info.header_offset, 6), (central, 8)):
        flags, stored = struct.unpack_from("<HH", data, header + flags_at)
        new_method = stored if method is None else method
        struct.pack_into("<HH", data, header + flags_at, flags | flag_bits, new_method)
    path.write_bytes(bytes(data))
    return path


def release(engines: Path, cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m warcore release ARGS`` seeing the fake engine (and no ``WARCORE_*``
    variable), bounded to two minutes."""
    return run_warcore(engines, cwd, "release", *args)


def run_warcore(
    engines: Path, cwd: Path, *args: str | Path, stdout: str = "pipe"
) -> subprocess.CompletedProcess[str]:
    """``python -m warcore ARGS`` with ``engines`` first on its path and its standard output
    captured (``stdout="pipe"``), closed (``"closed"``: started with descriptor 1 closed, as
    ``>&-`` does) or ``/dev/full`` (``"full"``)."""
    command = [sys.executable, "-m", "warcore", *map(str, args)]
    return run_command(engines, cwd, command, stdout)


def run_command(
    engines: Path, cwd: Path, command: list[str], stdout: str = "pipe"
) -> subprocess.CompletedProcess[str]:
    """``command`` as :func:`run_warcore` runs ``warcore``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARCORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(engines), env.get("PYTHONPATH", "")])
    if stdout == "closed":
        command = ["sh", "-c", 'exec "$@" >&-', "sh", *command]
    with open(os.devnull if stdout != "full" else "/dev/full", "w") as sink:
        return subprocess.run(
            command,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE if stdout == "pipe" else sink,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
