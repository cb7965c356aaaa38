"""An engine release's wheel, read without installing, extracting or importing it.

:func:`fetched` downloads one with ``pip download --no-deps`` into a temporary folder that is
removed however the block ends (an error, Ctrl-C, SIGTERM); :func:`open_wheel` says what a
wheel file is (its distribution, version and hash) or why it is not one; :class:`SourceTree`
holds its Python sources, in memory, as the index the structural checks and ``warcore
release`` read (a :class:`~warcore.integration.checks.SourceIndex`).

Any file is read safely: whatever is wrong with it (a broken zip index, corrupt or encrypted
members, an unknown compression, a source nested past what the parser takes) is one
:class:`BadWheel` naming the file and the member; memory stays bounded, each ``.py`` member's
uncompressed size checked before it is read (:data:`MAX_MODULE_BYTES`,
:data:`MAX_SOURCE_BYTES`).

Standard library and ``packaging`` only.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from . import source_code
from .engine_code import ShapeMismatch, audit_in_source
from .source_code import Binding

__all__ = [
    "FETCH_TIMEOUT_S",
    "MAX_INDEX_BYTES",
    "MAX_MODULE_BYTES",
    "MAX_MODULE_TOKENS",
    "MAX_SOURCE_BYTES",
    "BadWheel",
    "FetchFailed",
    "SourceTree",
    "Wheel",
    "fetched",
    "open_wheel",
]

FETCH_TIMEOUT_S = 900
"""How long ``pip download`` may take: a 340 MB wheel from a slow index, with room to spare;
past it the download is stopped and the folder removed."""

MAX_MODULE_BYTES = 16 << 20
"""The largest ``.py`` member read (uncompressed), checked before reading it: 60 times the
largest module of the audited releases (sglang 0.5.23's ``scheduler.py``, 282 kB)."""

MAX_SOURCE_BYTES = 256 << 20
"""All ``.py`` members together (uncompressed), checked before any is read: about 4 times
sglang 0.5.23's 68 MB, the most of the audited releases (vLLM 0.34.0: 56 MB)."""

MAX_MODULE_TOKENS = 200_000
"""The most tokens (:func:`~warcore.integration.source_code.tokens`) of a module parsed, checked
before parsing it: a syntax tree takes up to about 900 bytes per token, so one parse stays
under about 180 MB whatever the module holds (1 MiB of bare names took 650 MB); 4 times the
largest module of the audited releases (48,000 tokens)."""

MAX_INDEX_BYTES = 8 << 20
"""The largest zip index (central directory) read, from the zip's end record before
:mod:`zipfile` reads it whole: each record becomes an object of about 500 bytes, so the
index stays under about 100 MB of memory; 12 times sglang 0.5.23's (6,396 members)."""

_READABLE = frozenset(
    {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
)
"""The compression methods :mod:`zipfile` reads (a wheel uses the first two)."""

_LOCATE_DEPTH = 16
"""Re-exports followed at most (``a`` imports from ``b``, which imports from ``c``...)."""


class BadWheel(ValueError):
    """The path given is not a wheel of the engine (one sentence naming it)."""


class FetchFailed(RuntimeError):
    """``pip download`` brought no wheel (its own last error line)."""


@dataclass(frozen=True)
class Wheel:
    """A wheel file, as its name and bytes say."""

    path: Path
    distribution: str
    """The distribution, canonicalized (``sglang``)."""
    version: Version
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name


def open_wheel(path: Path) -> Wheel:
    """``path`` as a :class:`Wheel`, or :class:`BadWheel` saying why it is not one (a path
    the file system refuses, such as a name longer than it allows, included)."""
    try:
        if not path.is_file():
            raise BadWheel(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    except OSError as exc:  # ENAMETOOLONG: the file system refuses the path itself
        raise BadWheel(f"{path}: {exc.strerror or exc}") from None
    try:
        distribution, version, _build, _tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, ValueError) as exc:  # ValueError: a version of 5,000 digits
        raise BadWheel(f"{path}: not a wheel ({exc})") from None
    try:
        if not zipfile.is_zipfile(path):
            raise BadWheel(f"{path}: not a wheel (not a zip archive)")
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise BadWheel(f"{path}: {exc.strerror or exc}") from None
    return Wheel(path, canonicalize_name(distribution), version, digest.hexdigest())


@contextmanager
def fetched(distribution: str, version: str, *, timeout: float = FETCH_TIMEOUT_S) -> Iterator[Path]:
    """The wheel of ``distribution==version`` for this interpreter, downloaded by ``pip
    download --no-deps --only-binary=:all:`` into a temporary folder, which is removed when
    the block ends, however it ends. :class:`FetchFailed` with pip's own error line when pip
    fails or takes more than ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="warcore-release-") as folder:
        wheels_at, scratch = Path(folder, "wheel"), Path(folder, "tmp")
        scratch.mkdir()
        command = [
            *(sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"),
            *("--disable-pip-version-check", "--no-input", "-d", str(wheels_at)),
            f"{distribution}=={version}",
        ]
        # pip's own temporary files go inside the folder too: a pip killed midway (Ctrl-C,
        # the timeout) cannot clean up after itself, and the folder's removal does
        env = {**os.environ, "TMPDIR": str(scratch), "TEMP": str(scratch), "TMP": str(scratch)}
        try:  # run() kills pip on any exception here, Ctrl-C included, before the folder goes
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=env
            )
        except subprocess.TimeoutExpired:
            raise FetchFailed(f"pip download took more than {timeout:g} s; stopped") from None
        if result.returncode != 0:
            raise FetchFailed(_last_error(result.stderr) or f"pip exited {result.returncode}")
        wheels = sorted(wheels_at.glob("*.whl"))
        if len(wheels) != 1:
            raise FetchFailed(f"pip download left {len(wheels)} wheels, expected one")
        yield wheels[0]


def _last_error(stderr: str) -> str:
    """pip's last ``ERROR:`` line (the one that says what failed), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    return (errors or lines or [""])[-1]


def _module_name(entry: str) -> tuple[str, bool] | None:
    """(module, is a package) for a wheel entry holding Python source, else ``None``."""
    path = PurePosixPath(entry)
    if path.suffix != ".py":
        return None
    parts = list(path.parts)
    if parts[0].endswith(".data") and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
        parts = parts[2:]  # <name>.data/purelib/<package>/...: installed at the root
    parts[-1] = parts[-1].removesuffix(".py")
    package = parts[-1] == "__init__"
    if package:
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        return None  # a .dist-info file, a script folder, a template with a dash in its name
    return ".".join(parts), package


def _check_index(path: Path) -> None:
    """:class:`BadWheel` if the zip's end record (its zip64 record, where it says so) gives
    an index larger than :data:`MAX_INDEX_BYTES`: the size :mod:`zipfile` reads whole,
    whatever the members number. A record it cannot find is left to :mod:`zipfile` to say."""
    with path.open("rb") as file:
        end = file.seek(0, os.SEEK_END)
        file.seek(max(0, end - 22 - 0xFFFF))  # the end record, after at most a 64 kB comment
        tail = file.read()
        at = len(tail) - 22 if tail[-22:-18] == _END and tail[-2:] == b"\0\0" else tail.rfind(_END)
        if at < 0 or len(tail) - at < 22:
            return
        (size,) = struct.unpack_from("<L", tail, at + 12)
        if size == 0xFFFFFFFF and at >= 20 and tail[at - 20 : at - 16] == _END64_LOCATOR:
            (record_at,) = struct.unpack_from("<Q", tail, at - 12)
            file.seek(record_at)
            record = file.read(56)
            if len(record) == 56 and record[:4] == _END64:
                (size,) = struct.unpack_from("<Q", record, 40)
    if size > MAX_INDEX_BYTES:
        raise BadWheel(
            f"{path}: its zip index is {size:,} bytes, over the limit of {MAX_INDEX_BYTES:,} "
            "(warcore.integration.wheel.MAX_INDEX_BYTES)"
        )


_END, _END64, _END64_LOCATOR = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"


def _source_members(
    path: Path, infos: list[zipfile.ZipInfo]
) -> dict[str, tuple[zipfile.ZipInfo, bool]]:
    """module -> (its member, whether a package) of the ``.py`` members of ``infos``, a
    package's ``__init__.py`` taking the name before a module's file; each readable by
    :func:`_read` within the limits, or :class:`BadWheel` naming it."""
    members: dict[str, tuple[zipfile.ZipInfo, bool]] = {}
    for info in infos:
        named = _module_name(info.filename)
        if named is None:
            continue
        module, package = named
        if module in members and members[module][1] and not package:
            continue  # x/__init__.py and x.py: Python imports the package
        _check_member(path, info)
        members[module] = (info, package)
    total = sum(info.file_size for info, _ in members.values())
    if total > MAX_SOURCE_BYTES:
        raise BadWheel(
            f"{path}: its .py members hold {total:,} bytes uncompressed, over the limit of "
            f"{MAX_SOURCE_BYTES:,} (warcore.integration.wheel.MAX_SOURCE_BYTES)"
        )
    return members


def _check_member(path: Path, info: zipfile.ZipInfo) -> None:
    """:class:`BadWheel` naming the member if it is encrypted, compressed by a method
    :mod:`zipfile` cannot read, or larger than :data:`MAX_MODULE_BYTES` uncompressed."""
    member = f"{path}: member {info.filename}"
    if info.flag_bits & 0x1:
        raise BadWheel(f"{member} is encrypted")
    if info.compress_type not in _READABLE:
        raise BadWheel(f"{member} is compressed by method {info.compress_type}, unknown to zipfile")
    if info.file_size > MAX_MODULE_BYTES:
        raise BadWheel(
            f"{member} is {info.file_size:,} bytes uncompressed, over the limit of "
            f"{MAX_MODULE_BYTES:,} (warcore.integration.wheel.MAX_MODULE_BYTES)"
        )


def _read(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The member's bytes, never more than its index says (nor the limit): what lies beyond
    fails its CRC instead. :class:`BadWheel` naming it for corrupt data."""
    try:
        with archive.open(info) as member:
            return member.read(MAX_MODULE_BYTES + 1)
    # RuntimeError: encrypted; lzma.LZMAError, OSError and ValueError: bz2's and lzma's data
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, OSError, ValueError) as exc:
        raise BadWheel(f"{path}: member {info.filename}: {exc}") from None


def _slim(binding: Binding) -> Binding:
    """``binding`` without its syntax tree, but for the name an alias (``C = B``, ``C =
    B[T]``) names: what :meth:`SourceTree.locate` reads, kept per module without keeping
    the module's tree alive past the parse cache's budget."""
    node = binding.node
    while isinstance(node, ast.Subscript):
        node = node.value
    alias = node if isinstance(node, (ast.Name, ast.Attribute)) else None
    return dataclasses.replace(binding, node=alias if binding.kind == "value" else None)


def _c3(lines: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The C3 merge of the bases' linearizations (``lines``, the bases' own order last),
    as Python orders a class's bases; where none exists (a hostile hierarchy), each line's
    classes in turn, each once."""
    pending = [list(line) for line in lines] + [[line[0] for line in lines]]
    merged: list[tuple[str, str]] = []
    while any(pending):
        heads = (line[0] for line in pending if line)
        head = next((h for h in heads if not any(h in line[1:] for line in pending)), None)
        if head is None:
            rest = [c for line in pending for c in line if c not in merged]
            return merged + list(dict.fromkeys(rest))
        merged.append(head)
        pending = [[c for c in line if c != head] for line in pending]
    return merged


def _decode(data: bytes) -> str:
    try:
        return importlib.util.decode_source(data)  # the coding cookie, universal newlines
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return data.decode("utf-8", errors="replace")


class SourceTree:
    """A release's Python sources by module, held in memory (nothing is extracted or
    imported): a :class:`~warcore.integration.checks.SourceIndex`.

    :meth:`locate` and :meth:`subclasses` follow each module's imports to where a class is
    defined (``from a import B as C``, ``import a.b as x`` then ``x.B``, relative imports,
    re-exports through a package's ``__init__``, ``from a import *``, an alias assignment
    ``C = B``), as far as the source says it (the rules of
    :mod:`~warcore.integration.source_code`). Approximated: a base class given by any other
    expression (a call, a variable holding a class) is not followed; a class defined inside
    a function, or made by ``type()``, is not seen; a module that does not parse has no
    classes. The search finds every subclass in the wheel, not only those a process imports
    (the live check's), so it sees more: the safe side."""

    def __init__(
        self, sources: Mapping[str, str | bytes], packages: frozenset[str], origin: str = ""
    ) -> None:
        """``sources``: module -> its source, as text or as the file's bytes (decoded when
        first read: most of a wheel's modules are only searched, as bytes); ``origin``: the
        file they came from, for errors."""
        self._raw = {m: s if isinstance(s, bytes) else s.encode() for m, s in sources.items()}
        self._sources = {m: s for m, s in sources.items() if isinstance(s, str)}
        self._packages = packages
        self._origin = origin or "sources"
        self._bindings: dict[str, dict[str, Binding]] = {}
        self._parsable: set[str] = set()
        self._mros: dict[tuple[str, str], list[tuple[str, str]]] = {}

    @classmethod
    def of_wheel(cls, path: Path) -> SourceTree:
        """Every ``.py`` module of the wheel at ``path``, read from the zip: where a package
        ``x/__init__.py`` and a module ``x.py`` are both there, the package (what Python
        imports). :class:`BadWheel` naming the file (and the member) for a zip that does not
        read back as its index says: a broken index, a member encrypted, compressed by a
        method :mod:`zipfile` lacks, corrupt or failing its CRC, or larger than
        :data:`MAX_MODULE_BYTES` (all of them than :data:`MAX_SOURCE_BYTES`): sizes are
        checked before anything is read, and no read goes past them."""
        try:
            _check_index(path)
            with zipfile.ZipFile(path) as archive:
                members = _source_members(path, archive.infolist())
                sources: dict[str, str | bytes] = {
                    module: _read(path, archive, info) for module, (info, _) in members.items()
                }
        except BadWheel:  # a ValueError too: already names the member
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
            raise BadWheel(f"{path}: not a readable zip archive ({exc})") from None
        packages = frozenset(module for module, (_, package) in members.items() if package)
        return cls(sources, packages, str(path))

    def modules(self) -> list[str]:
        return sorted(self._raw)

    def source(self, module: str) -> str | None:
        text = self._sources.get(module)
        if text is None and module in self._raw:
            text = self._sources[module] = _decode(self._raw[module])
        return text

    def is_module(self, name: str) -> bool:
        return name in self._raw

    def mentioning(self, *words: str) -> list[str]:
        """The modules whose source contains every one of ``words`` (a cheap first filter:
        any reference to a name spells it)."""
        wanted = [word.encode() for word in words]
        return [m for m, data in sorted(self._raw.items()) if all(w in data for w in wanted)]

    def tree(self, module: str) -> ast.Module | None:
        """The module's syntax tree; ``None`` where it is absent or does not parse. A module
        nested past what Python's parser takes (100,000 unary minus: its ``MemoryError``) is
        no release's code but a hostile file: :class:`BadWheel` naming it."""
        text = self.source(module)
        if text is None:
            return None
        if module not in self._parsable:
            if source_code.tokens(text, MAX_MODULE_TOKENS) > MAX_MODULE_TOKENS:
                raise BadWheel(
                    f"{self._origin}: module {module} holds more than {MAX_MODULE_TOKENS:,} "
                    "tokens, over the limit (warcore.integration.wheel.MAX_MODULE_TOKENS)"
                )
            self._parsable.add(module)
        try:
            return source_code.parse(text)
        except (SyntaxError, ValueError):
            return None
        except (MemoryError, RecursionError) as exc:
            raise BadWheel(
                f"{self._origin}: module {module} is nested too deeply for Python's parser "
                f"({type(exc).__name__})"
            ) from None

    def function(self, module: str, qualname: str) -> tuple[str, str] | None:
        """(signature, digest) of the function ``qualname`` as ``module`` binds it at run time
        (:func:`~warcore.integration.engine_code.audit_in_source`: a name defined twice is
        its last ``def``); ``None`` where the module does not define it (or does not parse)."""
        if self.tree(module) is None:  # parsed here first: a hostile module is a BadWheel
            return None
        try:
            return audit_in_source(self.source(module) or "", qualname)
        except (LookupError, SyntaxError, ValueError, ShapeMismatch):
            return None

    def definitions(self, qualname: str) -> dict[str, tuple[str, str]]:
        """module -> (signature, digest) of every module of the wheel defining the function
        ``qualname`` (``Class.method``: the class is that module's)."""
        *owners, name = qualname.split(".")
        words = [f"def {name}", *(f"class {owner}" for owner in owners[:1])]
        found = ((m, self.function(m, qualname)) for m in self.mentioning(*words))
        return {module: row for module, row in found if row is not None}

    def inherited(self, module: str, qualname: str) -> tuple[str, str] | None:
        """(module, qualified name) of the method that ``Class.name`` (``qualname``, the
        class as ``module`` names it) resolves to when the class does not bind ``name`` itself:
        the first of its bases in the wheel to bind it, in method resolution order
        (``Mixin.name``). ``None`` where the class is not there, binds the name itself, or
        the base binding it first does not ``def`` it; a base outside the wheel is not read."""
        owner, _, name = qualname.rpartition(".")
        for where in self._mro(module, owner, _LOCATE_DEPTH) if owner else ():
            binding = self._class_bindings(where).get(name)
            if binding is not None:
                own = where == self.locate(module, owner)
                if own or binding.kind != "function":
                    return None
                return where[0], f"{where[1]}.{name}"
        return None

    def _class_node(self, where: tuple[str, str]) -> ast.ClassDef | None:
        tree = self.tree(where[0])
        return source_code.find_class(tree, where[1]) if tree is not None else None

    def _class_bindings(self, where: tuple[str, str]) -> dict[str, Binding]:
        node = self._class_node(where)
        return source_code.bindings(node.body) if node is not None else {}

    def _mro(self, module: str, qualname: str, depth: int) -> list[tuple[str, str]]:
        """(module, qualified name) of the class ``module`` names ``qualname`` and of its
        bases in the wheel, in C3 order (depth-first where the bases admit none); those
        outside the wheel are left out."""
        where = self.locate(module, qualname)
        node = self._class_node(where) if where is not None and depth > 0 else None
        if where is None or node is None:
            return []
        if where not in self._mros:
            self._mros[where] = [where]  # a class deriving from itself (a hostile file) ends
            bases = [source_code.dotted(base) for base in node.bases]
            lines = [self._mro(where[0], b, depth - 1) for b in bases if b is not None]
            self._mros[where] = [where, *_c3([line for line in lines if line])]
        return self._mros[where]

    def bindings(self, module: str) -> dict[str, Binding]:
        """What ``module`` binds at run time (:func:`~warcore.integration.source_code.bindings`)."""
        found = self._bindings.get(module)
        if found is None:
            tree = self.tree(module)
            body = tree.body if tree is not None else []
            bound = source_code.bindings(body, module, module in self._packages)
            found = {name: _slim(binding) for name, binding in bound.items()}
            self._bindings[module] = found
        return found

    def locate(self, module: str, qualname: str) -> tuple[str, str] | None:
        """(module, qualified name) where the name ``qualname`` that ``module`` uses is
        bound (a class, a function, an assignment), imports, re-exports and aliases
        (``C = B``) followed; ``(module, "")`` for a name that is a module of the wheel;
        ``None`` where the wheel does not bind it (an external package's class, a name
        nothing binds)."""
        return self._locate(module, qualname, _LOCATE_DEPTH)

    def _locate(self, module: str, qualname: str, depth: int) -> tuple[str, str] | None:
        if depth <= 0 or module not in self._raw:
            return None
        head, _, rest = qualname.partition(".")
        binding = self.bindings(module).get(head)
        if binding is None:
            tree = self.tree(module)
            body = tree.body if tree is not None else []
            stars = source_code.star_imports(body, module, module in self._packages)
            found = (self._locate(star, qualname, depth - 1) for star in stars)
            return next((hit for hit in found if hit is not None), None)
        if binding.kind in ("class", "function"):
            return module, qualname
        if binding.kind == "module":
            return self._in_module(binding.target, rest, depth)
        if binding.kind == "from":
            if self.is_module(f"{binding.target}.{binding.name}"):
                return self._in_module(f"{binding.target}.{binding.name}", rest, depth)
            name = binding.name + (f".{rest}" if rest else "")
            return self._locate(binding.target, name, depth - 1)
        alias = source_code.dotted(binding.node) if isinstance(binding.node, ast.expr) else None
        if alias is None or alias.split(".")[0] == head:
            return module, qualname  # a value assigned here, not another name for one
        return self._locate(module, alias + (f".{rest}" if rest else ""), depth - 1)

    def _in_module(self, module: str, rest: str, depth: int) -> tuple[str, str] | None:
        """``rest`` (``b.C``) looked up from the module ``module`` (``a``): ``a.b`` if that is
        a module, then ``C`` in it."""
        parts = rest.split(".") if rest else []
        while parts and self.is_module(f"{module}.{parts[0]}"):
            module = f"{module}.{parts.pop(0)}"
        return self._locate(module, ".".join(parts), depth - 1) if parts else (module, "")

    def subclasses(self, module: str, qualname: str) -> list[tuple[str, str]]:
        """(module, qualified name) of every class of the wheel deriving, directly or
        through others, from the class ``qualname`` that ``module`` names; in the order
        found (breadth first), each once."""
        root = self.locate(module, qualname) or (module, qualname)
        found: list[tuple[str, str]] = []
        queue = [root]
        while queue:
            parent = queue.pop(0)
            for child in self._direct_subclasses(parent):
                if child != root and child not in found:
                    found.append(child)
                    queue.append(child)
        return found

    def _direct_subclasses(self, parent: tuple[str, str]) -> Iterator[tuple[str, str]]:
        name = parent[1].rsplit(".", 1)[-1]
        for module in self.mentioning(name):
            tree = self.tree(module)
            for qualname, node in source_code.classes(tree) if tree else ():
                bases = (source_code.dotted(base) for base in node.bases)
                if any(self.locate(module, b) == parent for b in bases if b is not None):
                    yield module, qualname
