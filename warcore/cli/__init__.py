"""The ``warcore`` command line (also ``python -m warcore``): argument parsing and printing.

One module per command (:mod:`~warcore.cli.plugins` holds ``plugins``, ``matrix`` and
``check``; then :mod:`~warcore.cli.bench`, :mod:`~warcore.cli.run`,
:mod:`~warcore.cli.sanitize`, :mod:`~warcore.cli.soak`, :mod:`~warcore.cli.release`), each
thin: it parses, calls the capability, prints. Each exports one :class:`Command` per
subcommand: a help line, a function that adds its arguments and a function that runs it and
returns the exit status. To add a command, write such a module and add an entry to
:data:`_COMMANDS`; import anything heavy (torch, the engine, the sanitizer) inside the run
function so that ``warcore plugins`` stays fast and works without a device.

May import every other part of warcore; nothing in warcore imports it (``warcore.__main__``
and the ``warcore`` console script aside).

Exit status: 0 ok, 1 problems found (``check``; a run or audit that found one), a plugin
failed under strict mode, or an algorithm's drafter or stager factory failed (``run``), 2 bad
usage or a malformed ``WARCORE_*`` environment variable (one line on stderr: argparse's errors
too, through :class:`~warcore.cli._common.Parser`), or a command that runs a forward (``run``,
``sanitize``, ``soak``, ``bench``) where torch is not installed (``pip install
'warcore[engine]'``) or an output file that cannot be written, 130 and 143 SIGINT or SIGTERM
stopped the command (one line; output files are written whole or not at all), 141 the reader
of stdout went away (quietly, like a Unix tool ended by SIGPIPE). A standard output that is
closed (``>&-``: refused before the command runs) or fails while written (``>/dev/full``) is
one line on stderr and exit 2, for every command: :func:`main` guards it, not each command.
Every error line is one line: control characters in it (a path's newline) are escaped
(:func:`~warcore.cli._common.one_line`).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, cast

from warcore._lazy import torch_missing
from warcore.cli._common import (
    PROG,
    Command,
    JsonOutput,
    Limit,
    Parser,
    UsageError,
    check_writable,
    one_line,
    write_output,
)
from warcore.cli.bench import BENCH
from warcore.cli.plugins import CHECK, MATRIX, PLUGINS
from warcore.cli.release import RELEASE
from warcore.cli.run import RUN
from warcore.cli.sanitize import SANITIZE
from warcore.cli.soak import SOAK
from warcore.core import PluginLoadError

__all__ = [
    "EXIT_BROKEN_PIPE",
    "Command",
    "JsonOutput",
    "Limit",
    "UsageError",
    "check_writable",
    "main",
    "run_command",
    "write_output",
]
"""``Limit``, ``JsonOutput``, ``check_writable``, ``write_output``, ``UsageError`` and
``run_command`` are also for plugins' own commands (``python -m warcore_sglang.serving.bench``...):
the same number, output, signal and standard-output rules."""

_COMMANDS: dict[str, Command] = {
    "plugins": PLUGINS,
    "matrix": MATRIX,
    "check": CHECK,
    "bench": BENCH,
    "run": RUN,
    "sanitize": SANITIZE,
    "soak": SOAK,
    "release": RELEASE,
}


def _add_commands(parser: argparse.ArgumentParser, commands: dict[str, Command], dest: str) -> None:
    sub = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    for name, command in commands.items():
        command.configure(sub.add_parser(name, help=command.help, description=command.help))


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG, description="Inspect and check warcore's read-done fence declarations."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log fallbacks (debug)")
    _add_commands(parser, _COMMANDS, dest="command")
    return parser


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter(f"{PROG}: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, handlers=[handler])


class _OneLineFormatter(logging.Formatter):
    """Each logged message on one line (:func:`~warcore.cli._common.one_line`: a plugin's
    error naming a path with a newline); a traceback (``-v``) follows it as it is."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return one_line(super().formatMessage(record))


EXIT_BROKEN_PIPE = 128 + 13
"""The exit status when the reader of stdout went away (``warcore matrix --json | head``):
what a shell reports for a Unix tool ended by SIGPIPE, so ``set -o pipefail`` sees it alike."""


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, lambda: _main(argv))


def run_command(prog: str, command: Callable[[], int]) -> int:
    """``command()``'s exit status, run as every warcore command runs, ``prog`` naming it in
    each line (a plugin's ``python -m`` command: ``raise SystemExit(run_command(PROG, main))``):
    a closed standard output refused before it runs (one line, 2), SIGINT and SIGTERM stopping
    it after every ``finally`` ran (one line, 130 and 143), the reader of stdout gone (quietly,
    141), stdout failing while written (``>/dev/full``: one line, 2)."""
    if sys.stdout is None:  # started with stdout closed: print() would drop every line
        _error("standard output is closed; redirect it to a file or /dev/null instead", prog)
        return 2
    with _stopped_by_signals(), _guarded_stdout():
        try:
            try:
                status = command()
                sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
            except BrokenPipeError:
                return _reader_gone()
            return status
        except KeyboardInterrupt:
            return _stopped(signal.SIGINT, prog)
        except _Stopped as stop:
            return _stopped(stop.signum, prog)
        except _StdoutFailed as failed:
            _discard_stdout()
            _error(f"standard output: {failed.error.strerror or failed.error}", prog)
            return 2


def _error(text: str, prog: str = PROG) -> None:
    print(f"{prog}: error: {one_line(text)}", file=sys.stderr)


def _main(argv: list[str] | None) -> int:
    args = _build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # benchmarks record it
    _setup_logging(args.verbose)
    try:
        return _COMMANDS[args.command].run(args)
    except UsageError as exc:
        _error(str(exc))
        return 2
    except PluginLoadError as exc:
        _error(str(exc))
        return 1
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        _error(torch_missing(f"{PROG} {args.command}"))
        return 2


class _StdoutFailed(BaseException):
    """Writing standard output failed (``>/dev/full``: ENOSPC; any error but a closed pipe).
    A ``BaseException``, so that no command's ``except OSError`` or ``except Exception``
    takes it for its own failure (an output file's, a plugin's): it unwinds to :func:`main`,
    every ``finally`` running on the way."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _GuardedStdout:
    """``sys.stdout`` while a command runs: its writes and flushes turn an ``OSError`` into
    :class:`_StdoutFailed` (a closed pipe stays ``BrokenPipeError``, handled as SIGPIPE);
    everything else is the stream's own. Writes made to ``sys.stdout.buffer`` directly fail
    at :func:`_main`'s final flush instead, which is guarded too."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailed(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailed(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _guarded_stdout() -> Iterator[None]:
    """:class:`_GuardedStdout` in place of ``sys.stdout`` for the block, the stream itself
    restored after (so :func:`main` called twice in one process guards once each time)."""
    stream = sys.stdout
    sys.stdout = cast(IO[str], _GuardedStdout(stream))
    try:
        yield
    finally:
        sys.stdout = stream


class _Stopped(BaseException):
    """SIGTERM arrived: unwinds like ``KeyboardInterrupt``, so every ``finally`` runs (engines
    close, temporary output files are removed) before :func:`main` says so."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM raises :class:`_Stopped` while a command runs (SIGINT already raises
    ``KeyboardInterrupt``); the previous handler is restored after. Only the main thread may
    set handlers: called from another thread (a test), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped(signum: int, prog: str) -> int:
    """One line, and the exit status a shell reports for a process ended by ``signum``
    (130 for SIGINT, 143 for SIGTERM). Output files are written whole or not at all
    (:mod:`warcore._files`), so nothing half-written is left."""
    name = signal.Signals(signum).name
    start = "\n" if sys.stderr.isatty() else ""  # after a progress bar's unfinished line
    print(f"{start}{prog}: {name}: stopped; no output file was left half-written", file=sys.stderr)
    return 128 + signum


def _reader_gone() -> int:
    """The reader of stdout went away: stop quietly, as Unix tools do."""
    _discard_stdout()
    return EXIT_BROKEN_PIPE


def _discard_stdout() -> None:
    """What is still buffered for stdout goes to /dev/null, so the interpreter's final flush
    cannot raise again (a second error, and exit 120, after the line already said)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (captured in a test)
        pass
