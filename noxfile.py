"""The plugin matrix: the core's tests in real environments holding different plugin sets.

The cells are data, in ``matrix.toml`` (which distributions each installs, whether from built
wheels, which pluggy versions it runs against); this file only knows how to run a cell. Each
cell is its own virtual environment with the distributions installed for real (one cell from
built wheels, not editable), and runs each installed distribution's own tests and, of the core
suite (``-m "not slow and not cuda"``), the tests whose outcome can depend on what the cell
installs: pytest's ``--matrix-cell`` keeps a test marked ``installed`` or ``plugins(...)`` (the
latter skips where its plugins are missing) or not marked at all, and leaves a test marked
``plugin_agnostic`` or ``isolated`` to the main job (``scripts/test.sh`` runs every test; an
``isolated`` test that touches an installed plugin fails there). A session on a pluggy version
other than ``newest``, the one the main job runs on, runs the whole core suite: every hook call
goes through pluggy. The rule and the markers: tests/_support/cells.py, docs/matrix.md.
tests/plugins/test_installed_matrix.py checks that ``warcore plugins --json`` and ``warcore
matrix --json`` describe exactly the entry points the cell's distributions declare; the wheel
cell also checks that every file of each source tree's packages is in its wheel.

torch is installed once, into ``.nox/_torch``, and every cell sees it through a ``.pth`` file
written before anything else is installed (so pip finds the requirement satisfied and never
downloads a multi-GB CUDA build). Run all cells with ``nox -s matrix``, one with
``nox -s "matrix(cell='none', pluggy='newest')"``; ``-- --plugin PATH`` (repeatable) installs
one more distribution (a source tree or a wheel) into every cell run. The rest of the
arguments after ``--`` go to pytest. See docs/matrix.md.

``nox -s sglang`` (not a default session; ``.ci/run`` runs it) tests warcore-sglang against the
newest audited sglang release's real classes (``plugins/sglang/sglang-releases.txt`` lists the
audited releases; each has its ``sglang-<version>-pins.txt``); ``nox -s sglang_server``
(``.ci/run`` too) starts that release's real ``Engine`` and HTTP server on this CPU with warcore
active and asserts on what their barriers did; ``nox -s "sglang_release(version='V')"`` (each
older audited release, ``.ci/run`` too) runs what that release changes: the class-level tests
that depend on it, and one real ``Engine``; ``nox -s sglang_refusal`` (``.ci/run`` too)
installs sglang 0.5.20, which warcore-sglang has not audited, and checks that ``install()``
refuses it and patches nothing, and that its real ``Engine`` says so in one start-up line and
serves alone; ``nox -s sglang_pd`` (``.ci/run`` too) starts the newest release's real prefill and
decode servers (Mooncake's non-CUDA transfer engine over TCP on 127.0.0.1) behind
sglang-router, and ``nox -s sglang_ray`` (``.ci/run`` too) its real ``RayEngine`` on a local
two-node Ray cluster, each with warcore active; ``nox -s vllm`` (``.ci/run`` too) audits the
real classes of each vLLM release warcore-vllm supports (one session per release,
``vllm(release='0.33.0')``, ``vllm(release='0.34.0')``).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox itself needs tomli before 3.11
    import tomli as tomllib

nox.options.sessions = ["matrix"]
nox.options.reuse_existing_virtualenvs = False

ROOT = Path(__file__).parent
MATRIX_FILE = ROOT / "matrix.toml"
TORCH = "torch==2.13.0"
TORCH_ENV = ROOT / ".nox" / "_torch"
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "numpy"]
ENTRY_POINT_GROUP = "warcore"
MAIN_PLUGGY = "newest"
"""The ``[pluggy]`` entry the main job runs on (``.venv`` resolves pyproject.toml's ``pluggy``
range to the newest release): a cell on it runs only the core tests ``--matrix-cell`` keeps."""


@dataclass(frozen=True)
class Distribution:
    """A plugin distribution a cell installs: a source tree, or a wheel."""

    name: str
    path: Path
    tests: Path | None = None

    @classmethod
    def at(cls, path: Path) -> Distribution:
        """The distribution at ``path`` (given by path, not by name): its ``tests/`` folder,
        if it has one, is its own tests."""
        tests = path / "tests"
        return cls(path.name, path, tests if tests.is_dir() else None)

    def entry_points(self) -> dict[str, str]:
        """``{entry-point name: module}`` of the group ``warcore``, from the distribution's own
        metadata (``pyproject.toml``, or a wheel's ``entry_points.txt``), never from what an
        environment happens to hold: the cell's expectation."""
        if self.path.suffix == ".whl":
            with zipfile.ZipFile(self.path) as wheel:
                names = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
                text = wheel.read(names[0]).decode() if names else ""
            parser = configparser.ConfigParser(delimiters=("=",))
            parser.optionxform = str  # type: ignore[assignment,method-assign]
            parser.read_string(text)
            table: dict[str, Any] = (
                dict(parser[ENTRY_POINT_GROUP]) if parser.has_section(ENTRY_POINT_GROUP) else {}
            )
        else:
            table = _project(self.path).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        return {name: value.split(":")[0].strip() for name, value in table.items()}


@dataclass(frozen=True)
class Cell:
    install: tuple[Distribution, ...]
    wheels: bool
    pluggy: tuple[str, ...]


def _is_path(entry: str) -> bool:
    return "/" in entry or entry.endswith(".whl")


def _read_matrix(path: Path) -> tuple[dict[str, str], dict[str, Distribution], dict[str, Cell]]:
    """``matrix.toml``: pluggy versions, distributions and cells. A cell installs
    distributions by name (from ``[distributions]``) or by path (an entry holding a ``/``,
    or a wheel); a name the file does not define, or a pluggy version it does not, is an
    error naming the cell and the name."""
    data = tomllib.loads(path.read_text())
    pluggy: dict[str, str] = dict(data["pluggy"])
    distributions = {
        name: Distribution(
            name,
            (path.parent / entry["path"]).resolve(),
            (path.parent / entry["path"] / entry["tests"]).resolve() if "tests" in entry else None,
        )
        for name, entry in data.get("distributions", {}).items()
    }
    cells: dict[str, Cell] = {}
    for name, entry in data["cells"].items():
        install = list(entry.get("install", ()))
        versions = tuple(entry.get("pluggy", ("newest",)))
        for what, names, known in (
            ("distribution", [n for n in install if not _is_path(n)], distributions),
            ("pluggy version", versions, pluggy),
        ):
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(
                    f"{path.name}: cell {name!r} names {what} {unknown[0]!r}, which is not "
                    f"defined there (defined: {', '.join(known)})"
                )
        cells[name] = Cell(
            tuple(
                Distribution.at((path.parent / n).resolve()) if _is_path(n) else distributions[n]
                for n in install
            ),
            bool(entry.get("wheels", False)),
            versions,
        )
    return pluggy, distributions, cells


PLUGGY, DISTRIBUTIONS, CELLS = _read_matrix(MATRIX_FILE)
PARAMS = [(cell, version) for cell, spec in CELLS.items() for version in spec.pluggy]


def _torch_site() -> Path:
    """A venv holding only torch (and its own requirements), built once and shared."""
    python = TORCH_ENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TORCH_ENV)], check=True)
    probe = [str(python), "-c", "import torch, sysconfig; print(sysconfig.get_paths()['purelib'])"]
    found = subprocess.run(probe, capture_output=True, text=True)
    if found.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", TORCH], check=True)
        found = subprocess.run(probe, capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def _share_torch(session: nox.Session) -> None:
    site = session.run(
        "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
    )
    assert isinstance(site, str)
    Path(site.strip(), "_warcore_shared_torch.pth").write_text(f"{_torch_site()}\n")


def _cache_bytecode(session: nox.Session) -> None:
    """Python writes what it compiles to ``__pycache__`` in this session's venv, whatever the
    caller's ``PYTHONDONTWRITEBYTECODE`` (set on these machines): the engines are installed
    ``--no-compile``, and without a cache every process that imports sglang compiled its 2,900
    modules again (6.7 s of a 17.7 s ``warcore matrix``, measured here)."""
    session.env["PYTHONDONTWRITEBYTECODE"] = ""


def _plugin_options(session: nox.Session) -> tuple[list[Distribution], list[str]]:
    """Split the arguments after ``--``: each ``--plugin PATH`` (or ``--plugin=PATH``) is one
    more distribution for the cell, a source tree (its ``tests/`` folder, if any, runs too)
    or a wheel; the rest go to pytest. A relative PATH is taken from where nox was run."""
    extra: list[Distribution] = []
    rest: list[str] = []
    args = list(session.posargs)
    while args:
        arg = args.pop(0)
        if arg != "--plugin" and not arg.startswith("--plugin="):
            rest.append(arg)
            continue
        value = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else "")
        if not value:
            session.error("--plugin needs a PATH (a plugin's source tree or a wheel)")
        path = Path(session.invoked_from, value).resolve()
        if not (path / "pyproject.toml").is_file() and not (
            path.suffix == ".whl" and path.is_file()
        ):
            session.error(f"--plugin {value}: {path} is neither a source tree nor a wheel")
        extra.append(Distribution.at(path))
    return extra, rest


def _install(
    session: nox.Session, distributions: Sequence[Distribution], wheels: bool, tools: Sequence[str]
) -> None:
    """``tools``, warcore and ``distributions`` in one pip call: editable source trees, or
    (``wheels``) wheels built from them and checked to hold their packages' every file; a
    distribution given as a wheel is installed as it is. This repository's trees build with the
    setuptools virtualenv puts in the cell (pip checks it satisfies their ``build-system``),
    not each in an isolated build environment of its own; a third-party tree gets pip's
    default."""
    trees = [ROOT, *(d.path for d in distributions if d.path.suffix != ".whl")]
    given = [str(d.path) for d in distributions if d.path.suffix == ".whl"]
    ours = all(tree == ROOT or ROOT in tree.parents for tree in trees)
    build = ["--no-build-isolation", "--check-build-dependencies"] if ours else []
    if wheels:
        built = Path(session.create_tmp()) / "wheels"
        shutil.rmtree(built, ignore_errors=True)
        pip_wheel = ["python", "-m", "pip", "wheel", "-q", "--no-deps", *build, "-w", str(built)]
        session.run(*pip_wheel, *map(str, trees))
        gaps = _wheel_gaps(built, trees)
        if gaps:
            session.error("; ".join(gaps))
        session.install(*tools, *sorted(_with_engine(str(w)) for w in built.glob("*.whl")), *given)
    else:
        # warcore with its engine extra (torch, which the shared-torch .pth already provides).
        editable = [f"{ROOT}[engine]", *map(str, trees[1:])]
        session.install(*build, *tools, *(arg for tree in editable for arg in ("-e", tree)), *given)


def _wheel_gaps(wheels: Path, trees: Sequence[Path]) -> list[str]:
    """The files of each source tree's packages (its wheel's top-level folders) that its wheel
    lacks, such as a data file not declared as package data: the editable cells read them
    from the tree, a user's ``pip install`` would not get them."""
    by_name = {_normalized(_project(tree)["name"]): tree for tree in trees}
    gaps = []
    for wheel in sorted(wheels.glob("*.whl")):
        tree = by_name[_normalized(wheel.name.split("-")[0])]
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
        packages = {n.split("/")[0] for n in names if "/" in n}
        for package in sorted(p for p in packages if not p.endswith((".dist-info", ".data"))):
            for path in sorted((tree / package).rglob("*")):
                name = path.relative_to(tree).as_posix()
                if path.is_file() and "__pycache__" not in path.parts and name not in names:
                    gaps.append(f"{wheel.name} lacks {name}")
    return gaps


def _project(tree: Path) -> dict[str, Any]:
    return dict(tomllib.loads((tree / "pyproject.toml").read_text())["project"])


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _with_engine(wheel: str) -> str:
    """warcore's own wheel with its engine extra; a plugin's wheel as it is."""
    return f"{wheel}[engine]" if Path(wheel).name.startswith("warcore-0") else wheel


def _assert_from_site_packages(distributions: Sequence[Distribution]) -> str:
    """A check that warcore and every entry-point module come from the installed wheels, not
    from a source tree (found, not imported: a module may fail on import on purpose)."""
    modules = sorted({"warcore", *(m for d in distributions for m in d.entry_points().values())})
    return (
        "import importlib.util\n"
        f"for name in {modules!r}:\n"
        "    origin = importlib.util.find_spec(name).origin\n"
        "    assert 'site-packages' in origin, (name, origin)\n"
    )


@nox.session
@nox.parametrize("cell,pluggy", PARAMS)
def matrix(session: nox.Session, cell: str, pluggy: str) -> None:
    extra, pytest_posargs = _plugin_options(session)
    distributions = [*CELLS[cell].install, *extra]
    for distribution in distributions:
        if not distribution.path.exists():
            session.skip(f"{distribution.path} is not in this checkout")
    _share_torch(session)
    _install(session, distributions, CELLS[cell].wheels, [PLUGGY[pluggy], *TEST_TOOLS])
    # Run from outside the checkout, so `import warcore` finds what the cell installed (the
    # wheels, in the wheel cell) rather than the source tree in the current directory.
    session.chdir(session.create_tmp())
    if CELLS[cell].wheels:
        session.run("python", "-c", _assert_from_site_packages(distributions))
    version = PLUGGY[pluggy].split("==")[1]
    session.run("python", "-c", f"import pluggy; assert pluggy.__version__ == '{version}'")
    expected = sorted({name for d in distributions for name in d.entry_points()})
    env = {"WARCORE_EXPECT_PLUGINS": ",".join(expected)}
    session.run("warcore", "plugins", env=env)
    pytest_args = ["-q", "-m", "not slow and not cuda", "-p", "no:cacheprovider"]
    pytest_args += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
    if pluggy == MAIN_PLUGGY:
        pytest_args.append("--matrix-cell")  # the rest of the core suite is the main job's
    own_tests = [str(d.tests) for d in distributions if d.tests is not None]
    session.run(
        "python",
        "-m",
        "pytest",
        *pytest_args,
        str(ROOT / "tests"),
        *own_tests,
        *pytest_posargs,
        env=env,
    )


SGLANG = ROOT / "plugins" / "sglang"
SGLANG_RELEASES = SGLANG / "sglang-releases.txt"
"""The sglang releases warcore-sglang audited, oldest first: the version list CI reads (each has
its pin file ``plugins/sglang/sglang-<version>-pins.txt``; a test checks it names exactly the
releases of ``warcore_sglang.releases``)."""
SGLANG_BOOT = SGLANG / "tests" / "_boot"
SGLANG_PLUGINS = ("trtllm_mha", "deepseek_v4", "dflash")
"""The repository's plugins (matrix.toml's distributions) installed beside warcore-sglang."""
SGLANG_SERVER_TESTS = SGLANG / "tests" / "server"
SGLANG_TEST_DISTS = ["sglang_fork_attn", "warcore_sglang_test_plugins"]
SGLANG_REFUSAL_TESTS = SGLANG / "tests" / "refusal"
SGLANG_RELEASE_TESTS = SGLANG / "tests" / "release"
SGLANG_UNAUDITED = "0.5.20"
"""An sglang release warcore-sglang has not audited (refused in ``nox -s sglang_refusal``)."""


def _listed(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


SGLANG_AUDITED = _listed(SGLANG_RELEASES)
SGLANG_NEWEST = SGLANG_AUDITED[-1]


def _sglang_pins(version: str) -> Path:
    return SGLANG / f"sglang-{version}-pins.txt"


def _assert_sglang_env(version: str) -> str:
    return (
        "from importlib.metadata import version as v; "
        f"assert v('sglang') == '{version}', v('sglang'); "
        "assert v('torch').startswith('2.13.0'), v('torch')"
    )


def _sglang_venv(session: nox.Session, version: str, pins: Path, editables: Sequence[Path]) -> None:
    """torch==2.13.0 (CPU) from the shared torch env, then sglang and what its imports need here
    from ``pins`` at once with ``--no-deps`` (sglang's own metadata asks for torch 2.14.1 and
    GPU-only packages, which must never be resolved; ``--no-compile``: pip's byte-compiling of
    sglang's wheel took 36 s, 4 s without, measured here, and what is imported compiles then),
    then warcore and ``editables`` editable, also ``--no-deps``; checks the versions installed
    (from metadata: ``import sglang`` itself needs the triton stand-in)."""
    _share_torch(session)
    _cache_bytecode(session)
    session.install("--no-deps", "--no-compile", "-r", str(pins))
    session.install(PLUGGY["newest"], "pytest>=8")
    trees = [ROOT, *editables]
    session.install("--no-deps", *(arg for path in trees for arg in ("-e", str(path))))
    session.run("python", "-c", _assert_sglang_env(version))


def _pytest_args(tmp: Path) -> list[str]:
    args = ["-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
    args += ["--rootdir", str(ROOT), "-W", "ignore::UserWarning"]
    # the servers' logs and traces stay in the session's own folder, whoever else uses /tmp
    return [*args, "-W", "ignore::DeprecationWarning", "--basetemp", str(tmp / "pytest")]


@nox.session
def sglang(session: nox.Session) -> None:
    """warcore-sglang against the newest audited sglang's real classes, on a CPU (not in the
    default sessions: ``nox -s sglang``; ``.ci/run`` runs it).

    The venv: :func:`_sglang_venv` with ``plugins/sglang/sglang-<newest>-pins.txt``, the
    repository's plugins and warcore-sglang editable. triton and torchvision are stood in by
    plugins/sglang/tests/_boot (where the real ones are absent). Runs plugins/sglang/tests
    (every class-level test, the release-agnostic ones included), then the lookup benchmark
    with a small count.
    """
    editables = [*(DISTRIBUTIONS[p].path for p in SGLANG_PLUGINS), SGLANG]
    _sglang_venv(session, SGLANG_NEWEST, _sglang_pins(SGLANG_NEWEST), editables)
    tmp = Path(session.create_tmp()).resolve()
    session.chdir(tmp)
    tests = [str(SGLANG / "tests"), "--ignore", str(SGLANG_SERVER_TESTS)]
    tests += ["--ignore", str(SGLANG_REFUSAL_TESTS), "--ignore", str(SGLANG_RELEASE_TESTS)]
    # nox -s sglang_pd's and sglang_ray's own environments
    tests += ["--ignore", str(SGLANG_PD_TESTS), "--ignore", str(SGLANG_RAY_TESTS)]
    session.run("python", "-m", "pytest", *_pytest_args(tmp), *tests, *session.posargs)
    env = {"PYTHONPATH": str(SGLANG_BOOT)}
    bench = ["python", "-m", "warcore_sglang.serving.bench", "--calls", "20000", "--repeat", "3"]
    session.run(*bench, env=env)


@nox.session
@nox.parametrize("version", SGLANG_AUDITED[:-1])
def sglang_release(session: nox.Session, version: str) -> None:
    """warcore-sglang on an older audited sglang release (``sglang-releases.txt``), on a CPU
    (``nox -s "sglang_release(version='0.5.22')"``; ``.ci/run`` runs each).

    Only what that release changes: the class-level tests whose outcome can depend on the sglang
    release installed (``-m "not any_release"``: every cell never earlier than that release's
    own answer nor than declared, the shape gate on its real modules, the drift tests where
    their shape applies, the tests of its own shape), and one real ``Engine`` with
    ``WARCORE_SGLANG=1`` beside one without (plugins/sglang/tests/release: the active line
    names the release, the tokens are sglang's own). The real-server and multi-rank suite runs
    on the newest release only (``nox -s sglang_server``).
    """
    editables = [*(DISTRIBUTIONS[p].path for p in SGLANG_PLUGINS), SGLANG]
    _sglang_venv(session, version, _sglang_pins(version), editables)
    tmp = Path(session.create_tmp()).resolve()
    session.chdir(tmp)
    tests = [str(SGLANG / "tests"), "--ignore", str(SGLANG_SERVER_TESTS)]
    tests += ["--ignore", str(SGLANG_REFUSAL_TESTS), "--ignore", str(SGLANG_PD_TESTS)]
    tests += ["--ignore", str(SGLANG_RAY_TESTS), "-m", "not any_release"]
    session.run("python", "-m", "pytest", *_pytest_args(tmp), *tests, *session.posargs)


@nox.session
def sglang_server(session: nox.Session) -> None:
    """warcore-sglang inside the newest audited sglang's real servers, on a CPU (not in the
    default sessions: ``nox -s sglang_server``; ``.ci/run`` runs it).

    The venv: :func:`_sglang_venv` with ``plugins/sglang/sglang-<newest>-server-pins.txt`` (the
    release's pins and what its serving path imports here), warcore-sglang editable (its entry
    points are what sglang and warcore load), and the test distributions of
    ``plugins/sglang/tests/server/dists`` built as wheels and installed: an out-of-tree sglang
    attention backend and third-party warcore plugins. ``sgl_kernel``, ``triton`` and
    ``torchvision`` are import-only stand-ins (``plugins/sglang/tests/_boot``, reaching every
    process through ``PYTHONPATH``). The tests start the real ``Engine`` and
    ``python -m warcore_sglang.serving.launch_server`` (HTTP on 127.0.0.1) from a tiny model
    written by the test, bound every wait and stop every process by its pid.
    """
    server_pins = SGLANG / f"sglang-{SGLANG_NEWEST}-server-pins.txt"
    _sglang_venv(session, SGLANG_NEWEST, server_pins, [SGLANG])
    _install_test_dists(session, SGLANG_TEST_DISTS)
    _run_server_tests(session, SGLANG_SERVER_TESTS)


SGLANG_PD_TESTS = SGLANG / "tests" / "pd"
PD_SYSTEM_LIBRARY = ("libibverbs.so.1", "libibverbs1")
"""The system library the Mooncake transfer engine's non-CUDA wheel links, and its Debian
package."""


def _missing_system_library(session: nox.Session) -> None:
    """One line, not a traceback from the first server's import, when the transfer engine's
    system library is absent."""
    import ctypes

    library, package = PD_SYSTEM_LIBRARY
    try:
        ctypes.CDLL(library)
    except OSError:
        session.error(
            f"{library} is missing: the Mooncake transfer engine (mooncake-transfer-engine-non-"
            f"cuda) links it; install it with: apt-get update && apt-get install -y {package}"
        )


@nox.session
def sglang_pd(session: nox.Session) -> None:
    """warcore-sglang inside sglang's prefill/decode disaggregation, real servers on a CPU (not
    in the default sessions: ``nox -s sglang_pd``; ``.ci/run`` runs it).

    The venv: :func:`_sglang_venv` with ``plugins/sglang/sglang-<newest>-pd-pins.txt`` (the
    serving path's pins, the Mooncake transfer engine's non-CUDA build, ``prometheus_client``
    and ``sglang-router``). The machine must have ``libibverbs.so.1`` (said in one line when
    absent). plugins/sglang/tests/pd starts a prefill and a decode server (Mooncake over TCP on
    127.0.0.1), ``sglang-router --pd-disaggregation`` in front and a plain server, bounded and
    stopped by pid (docs/sglang-pd.md).
    """
    _missing_system_library(session)
    pd_pins = SGLANG / f"sglang-{SGLANG_NEWEST}-pd-pins.txt"
    _sglang_venv(session, SGLANG_NEWEST, pd_pins, [SGLANG])
    _run_server_tests(session, SGLANG_PD_TESTS)


def _install_test_dists(session: nox.Session, names: Sequence[str]) -> None:
    """The test distributions of ``plugins/sglang/tests/server/dists``, built as wheels and
    installed (their entry points are what sglang and warcore load)."""
    wheels = Path(session.create_tmp()) / "dists"
    shutil.rmtree(wheels, ignore_errors=True)
    dists = [str(SGLANG_SERVER_TESTS / "dists" / d) for d in names]
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), *dists)
    session.install("--no-deps", *sorted(str(w) for w in wheels.glob("*.whl")))


def _run_server_tests(session: nox.Session, tests: Path) -> None:
    tmp = Path(session.create_tmp()).resolve()  # absolute: the chdir below moves into it
    session.chdir(tmp)
    args = [*_pytest_args(tmp), "-rA", "--durations=5"]
    session.run("python", "-m", "pytest", *args, str(tests), *session.posargs)


@nox.session
def sglang_refusal(session: nox.Session) -> None:
    """warcore-sglang against an sglang release it has not audited (0.5.20), on a CPU (not in
    the default sessions: ``nox -s sglang_refusal``; ``.ci/run`` runs it).

    The venv: :func:`_sglang_venv` with ``plugins/sglang/sglang-0.5.20-pins.txt`` and
    warcore-sglang editable. Runs plugins/sglang/tests/refusal: ``install()`` refuses on that
    release's real classes and patches nothing, and its real ``Engine`` with
    ``WARCORE_SGLANG=1`` says so in one start-up line and serves on sglang's own decisions.
    """
    _sglang_venv(session, SGLANG_UNAUDITED, _sglang_pins(SGLANG_UNAUDITED), [SGLANG])
    _run_server_tests(session, SGLANG_REFUSAL_TESTS)


SGLANG_RAY_TESTS = SGLANG / "tests" / "ray"


@nox.session
def sglang_ray(session: nox.Session) -> None:
    """warcore-sglang in sglang's ``RayEngine`` (each scheduler a Ray actor) on a local Ray
    cluster on a CPU (not in the default sessions: ``nox -s sglang_ray``; ``.ci/run`` runs it).

    The venv: :func:`_sglang_venv` with ``plugins/sglang/sglang-<newest>-ray-pins.txt`` (the
    serving path's pins and Ray's core). plugins/sglang/tests/ray starts one Ray cluster of two
    nodes on 127.0.0.1 (``ray.cluster_utils.Cluster``, 80 MiB object stores) and five
    ``RayEngine`` drivers on it, one after the other, each bounded and stopped by pid
    (docs/sglang-ray.md).
    """
    ray_pins = SGLANG / f"sglang-{SGLANG_NEWEST}-ray-pins.txt"
    _sglang_venv(session, SGLANG_NEWEST, ray_pins, [SGLANG])
    _run_server_tests(session, SGLANG_RAY_TESTS)


VLLM = ROOT / "plugins" / "vllm"
VLLM_RELEASES = sorted(
    (p.name.removeprefix("vllm-").removesuffix("-pins.txt") for p in VLLM.glob("vllm-*-pins.txt")),
    key=lambda v: tuple(int(n) for n in v.split(".")),
)
"""The vLLM releases warcore-vllm is tested on: one pin file ``plugins/vllm/vllm-<v>-pins.txt``
each, the one list (a test checks it is ``warcore_vllm.releases.RELEASES``'s keys)."""


def _assert_vllm_env(release: str) -> str:
    return (
        "from importlib.metadata import version as v; "
        f"assert v('vllm') == '{release}', v('vllm'); "
        "assert v('torch').startswith('2.13.0'), v('torch')"
    )


@nox.session
@nox.parametrize("release", VLLM_RELEASES)
def vllm(session: nox.Session, release: str) -> None:
    """warcore-vllm against one vLLM release's real classes, on a CPU (not in the default
    sessions: ``nox -s vllm`` runs every release, ``nox -s "vllm(release='0.34.0')"`` one;
    ``.ci/run`` runs them).

    torch==2.13.0 (CPU) comes from the shared torch env (``.nox/_torch``, seen through a
    ``.pth`` file written before anything else); vLLM and every package its imports need here
    are installed at once from the release's pin file with ``--no-deps`` (vLLM's own metadata
    asks for torch 2.14.0 and GPU-only packages, which must never be resolved), then warcore
    and warcore-vllm editable, also ``--no-deps``. Runs plugins/vllm/tests, which run the audit
    (``python -m warcore_vllm.audit``'s ``main``) and print its output.
    """
    _share_torch(session)
    _cache_bytecode(session)
    # --no-compile: pip byte-compiles every file of the pins (vLLM's 473-855 MB among them),
    # 43 s against 25 s without (measured here); only what the tests import needs compiling,
    # and Python compiles it on import
    session.install("--no-deps", "--no-compile", "-r", str(VLLM / f"vllm-{release}-pins.txt"))
    session.install(PLUGGY["newest"], "pytest>=8", "setuptools>=64")
    # no build isolation: the two editable installs build with the venv's setuptools (3 s)
    # instead of installing it into a fresh build env each (10 s, measured here)
    editables = ["--no-build-isolation", "-e", str(ROOT), "-e", str(VLLM)]
    session.install("--no-deps", "--no-compile", *editables)
    session.run("python", "-c", _assert_vllm_env(release))
    session.chdir(session.create_tmp())
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
    pytest_args += ["--rootdir", str(ROOT), "-W", "ignore::DeprecationWarning", "--durations=5"]
    session.run("python", "-m", "pytest", *pytest_args, str(VLLM / "tests"), *session.posargs)


if __name__ == "__main__":  # pragma: no cover - convenience
    os.execvp("nox", ["nox", *sys.argv[1:]])
