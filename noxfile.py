"""The plugin matrix: the core's tests in real environments holding different plugin sets.

Each cell is its own virtual environment with the distributions installed for real (one cell
from built wheels, not editable), and runs the core suite (``-m "not slow"``; tests of plugins
a cell lacks skip themselves) plus tests/test_installed_matrix.py, which checks that
``warcore plugins --json`` and ``warcore matrix --json`` describe exactly what the cell
installed. A pluggy axis runs the full cell against the lowest supported and the newest pluggy.

torch is installed once, into ``.nox/_torch``, and every cell sees it through a ``.pth`` file
written before anything else is installed (so pip finds the requirement satisfied and never
downloads a multi-GB CUDA build). Run all cells with ``nox -s matrix``, one with
``nox -s "matrix(cell='none', pluggy='newest')"``.

``nox -s sglang`` (not a default session; ``.ci/run`` runs it) tests warcore-sglang against
sglang 0.5.23's real classes, installed from ``plugins/sglang/sglang-0.5.23-pins.txt``;
``nox -s sglang_server`` (``.ci/run`` too) starts sglang 0.5.23's real ``Engine`` and HTTP
server on this CPU with warcore active and asserts on what their barriers did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.options.sessions = ["matrix"]
nox.options.reuse_existing_virtualenvs = False

ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"
TORCH_ENV = ROOT / ".nox" / "_torch"
PLUGGY = {"lowest": "pluggy==1.5.0", "newest": "pluggy==1.7.0"}
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "numpy"]

PLUGINS = {
    "trtllm_mha": "plugins/trtllm_mha",
    "deepseek_v4": "plugins/deepseek_v4",
    "dflash": "plugins/dflash",
    "broken_fixture": "tests/fixtures/broken_plugin",
    "acme": "examples/acme_backend",
    "ngram": "examples/ngram_algorithm",
}
EXAMPLES = frozenset({"acme", "ngram"})
"""Third-party example distributions: their cells also run the example's own tests."""
ALL_THREE = ["trtllm_mha", "deepseek_v4", "dflash"]
CELLS: dict[str, list[str]] = {
    "none": [],
    "trtllm_mha": ["trtllm_mha"],
    "deepseek_v4": ["deepseek_v4"],
    "dflash": ["dflash"],
    "all": ALL_THREE,
    "all-wheels": ALL_THREE,
    "all-broken": [*ALL_THREE, "broken_fixture"],
    "acme": ["acme"],
    "ngram": ["ngram"],
}
# The pluggy axis on the full cell; the others use the newest pluggy.
PARAMS = [(cell, "newest") for cell in CELLS] + [("all", "lowest")]


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


def _entry_point_name(plugin: str) -> str:
    return plugin


@nox.session
@nox.parametrize("cell,pluggy", PARAMS)
def matrix(session: nox.Session, cell: str, pluggy: str) -> None:
    plugins = CELLS[cell]
    for example in EXAMPLES.intersection(plugins):
        if not (ROOT / PLUGINS[example]).exists():
            session.skip(f"{PLUGINS[example]} is not in this checkout")
    _share_torch(session)
    session.install(PLUGGY[pluggy], *TEST_TOOLS)
    paths = [str(ROOT / p) for p in (".", *(PLUGINS[p] for p in plugins))]
    if cell == "all-wheels":
        wheels = Path(session.create_tmp()) / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), *paths)
        session.install(*sorted(str(w) for w in wheels.glob("*.whl")))
    else:
        session.install(*(arg for path in paths for arg in ("-e", path)))
    # Run from outside the checkout, so `import warcore` finds what the cell installed (the
    # wheels, in the wheel cell) rather than the source tree in the current directory.
    session.chdir(session.create_tmp())
    if cell == "all-wheels":
        session.run("python", "-c", _ASSERT_INSTALLED_FROM_WHEEL)
    version = PLUGGY[pluggy].split("==")[1]
    session.run("python", "-c", f"import pluggy; assert pluggy.__version__ == '{version}'")
    env = {"WARCORE_EXPECT_PLUGINS": ",".join(sorted(_installed_entry_points(plugins)))}
    session.run("warcore", "plugins", env=env)
    pytest_args = ["-q", "-m", "not slow and not cuda", "-p", "no:cacheprovider"]
    pytest_args += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
    example_tests = [str(ROOT / PLUGINS[p] / "tests") for p in plugins if p in EXAMPLES]
    session.run(
        "python",
        "-m",
        "pytest",
        *pytest_args,
        str(ROOT / "tests"),
        *example_tests,
        *session.posargs,
        env=env,
    )


_ASSERT_INSTALLED_FROM_WHEEL = (
    "import warcore, warcore_dflash; "
    "assert 'site-packages' in warcore.__file__, warcore.__file__; "
    "assert 'site-packages' in warcore_dflash.__file__, warcore_dflash.__file__"
)


def _installed_entry_points(plugins: list[str]) -> set[str]:
    names = set()
    for plugin in plugins:
        if plugin in EXAMPLES:
            names |= _example_entry_points(plugin)
        else:
            names.add(plugin)
    return names


def _example_entry_points(example: str) -> set[str]:
    text = (ROOT / PLUGINS[example] / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.warcore]", 1)[1].split("\n[", 1)[0]
    return {line.split("=")[0].strip() for line in section.splitlines() if "=" in line}


SGLANG = ROOT / "plugins" / "sglang"
SGLANG_PINS = SGLANG / "sglang-0.5.23-pins.txt"
SGLANG_BOOT = SGLANG / "tests" / "_boot"
SGLANG_SERVER_PINS = SGLANG / "sglang-0.5.23-server-pins.txt"
SGLANG_SERVER_TESTS = SGLANG / "tests" / "server"
SGLANG_TEST_DISTS = ["sglang_fork_attn", "warcore_sglang_test_plugins"]
_ASSERT_SGLANG_ENV = (
    "from importlib.metadata import version as v; "
    "assert v('sglang') == '0.5.23', v('sglang'); "
    "assert v('torch').startswith('2.13.0'), v('torch')"
)


@nox.session
def sglang(session: nox.Session) -> None:
    """warcore-sglang against sglang 0.5.23's real classes, on a CPU (not in the default
    sessions: ``nox -s sglang``; ``.ci/run`` runs it).

    torch==2.13.0 (CPU) comes from the shared torch env (``.nox/_torch``, pip-installed pinned,
    seen through a ``.pth`` file written before anything else); sglang and every package its
    imports need here are installed at once from the pin file with ``--no-deps`` (sglang's own
    metadata asks for torch 2.14.1 and GPU-only packages, which must never be resolved), then
    warcore, its plugins and warcore-sglang editable, also ``--no-deps``. triton and
    torchvision are stood in by plugins/sglang/tests/_boot (where the real ones are absent).
    Runs plugins/sglang/tests, then the lookup benchmark with a small count.
    """
    _share_torch(session)
    session.install("--no-deps", "-r", str(SGLANG_PINS))
    session.install(PLUGGY["newest"], "pytest>=8")
    editables = [ROOT, *(ROOT / PLUGINS[p] for p in ALL_THREE), SGLANG]
    session.install("--no-deps", *(arg for path in editables for arg in ("-e", str(path))))
    # Versions from metadata: `import sglang` itself needs the triton stand-in.
    session.run("python", "-c", _ASSERT_SGLANG_ENV)
    session.chdir(session.create_tmp())
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
    pytest_args += ["--rootdir", str(ROOT), "-W", "ignore::UserWarning"]
    pytest_args += ["-W", "ignore::DeprecationWarning"]
    tests = [str(SGLANG / "tests"), "--ignore", str(SGLANG_SERVER_TESTS)]
    session.run("python", "-m", "pytest", *pytest_args, *tests, *session.posargs)
    env = {"PYTHONPATH": str(SGLANG_BOOT)}
    bench = ["python", "-m", "warcore_sglang.bench", "--calls", "20000", "--repeat", "3"]
    session.run(*bench, env=env)


@nox.session
def sglang_server(session: nox.Session) -> None:
    """warcore-sglang inside sglang 0.5.23's real servers, on a CPU (not in the default
    sessions: ``nox -s sglang_server``; ``.ci/run`` runs it).

    The venv: torch==2.13.0 (CPU) from the shared torch env, sglang and what its serving path
    imports here from ``plugins/sglang/sglang-0.5.23-server-pins.txt`` (``--no-deps``, as for
    ``nox -s sglang``), warcore and warcore-sglang (editable, ``--no-deps``; their entry points
    are what sglang and warcore load), and the test distributions of
    ``plugins/sglang/tests/server/dists`` built as wheels and installed: an out-of-tree sglang
    attention backend and third-party warcore plugins. ``sgl_kernel``, ``triton`` and
    ``torchvision`` are import-only stand-ins (``plugins/sglang/tests/_boot``, reaching every
    process through ``PYTHONPATH``). The tests start the real ``Engine`` and
    ``python -m warcore_sglang.launch_server`` (HTTP on 127.0.0.1) from a tiny model written
    by the test, bound every wait and stop every process by its pid.
    """
    _share_torch(session)
    session.install("--no-deps", "-r", str(SGLANG_SERVER_PINS))
    session.install(PLUGGY["newest"], "pytest>=8")
    session.install("--no-deps", "-e", str(ROOT), "-e", str(SGLANG))
    wheels = Path(session.create_tmp()) / "dists"
    shutil.rmtree(wheels, ignore_errors=True)
    dists = [str(SGLANG_SERVER_TESTS / "dists" / d) for d in SGLANG_TEST_DISTS]
    session.run("python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), *dists)
    session.install("--no-deps", *sorted(str(w) for w in wheels.glob("*.whl")))
    session.run("python", "-c", _ASSERT_SGLANG_ENV)
    tmp = Path(session.create_tmp()).resolve()  # absolute: the chdir below moves into it
    session.chdir(tmp)
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml")]
    pytest_args += ["--rootdir", str(ROOT), "-W", "ignore::UserWarning"]
    pytest_args += ["-W", "ignore::DeprecationWarning", "-rA", "--durations=5"]
    # the servers' logs and traces stay in the session's own folder, whoever else uses /tmp
    pytest_args += ["--basetemp", str(tmp / "pytest")]
    session.run("python", "-m", "pytest", *pytest_args, str(SGLANG_SERVER_TESTS), *session.posargs)


if __name__ == "__main__":  # pragma: no cover - convenience
    os.execvp("nox", ["nox", *sys.argv[1:]])
