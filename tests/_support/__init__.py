"""Helpers shared by the test modules: not tests, and never a test module imported by another.

``fake_dists`` (fake plugin distributions), ``engine`` (an independent oracle and test
backends for the engine), ``audit`` (backends and plugins for the sanitizer and tracer).
Fixtures are in ``tests/conftest.py``; this package is importable because pytest puts the
folder of that conftest on ``sys.path``.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the documentation some tests check lives there)."""
