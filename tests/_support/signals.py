"""Signals as a user at a terminal sends them, whoever started the test run."""

from __future__ import annotations

import signal

__all__ = ["sigint_as_a_terminal_sends_it"]


def sigint_as_a_terminal_sends_it() -> None:
    """A child's ``preexec_fn``: SIGINT back to its default action. A shell without job
    control starts a background command (``.ci/run &``, a lane of it) with SIGINT ignored, every
    process below inherits that, and a Python started so never raises KeyboardInterrupt: a test
    of what Ctrl-C does would then test nothing but the ignoring."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
