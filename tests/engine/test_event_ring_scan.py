"""Every publisher in the package draws its read-done events from its ring (issue 20, like
sglang #31698's scan of every module that writes an event into the mailbox).

A read-done event recorded outside a ring (a fresh ``record_event()``, an event kept by hand)
re-arms whenever its publisher records again, so a consumer that waits later binds to the wrong
forward's record. The scan reads every module's syntax tree: a ``mailbox.put(x)`` must hand over
``None``, a ring's record (``<...>.ring.record(stream)``) or a graph runner's in-graph event of
the replayed slot (``<...>.node_events[slot]``: the persistent event at depth 1, which the
binding audit checks on every wait, or the ring of captured record nodes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import warcore

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

PACKAGE = Path(warcore.__file__).parent


def _tail(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _allowed(arg: ast.expr) -> bool:
    if isinstance(arg, ast.Constant) and arg.value is None:
        return True
    if (
        isinstance(arg, ast.Subscript)
        and isinstance(arg.value, ast.Attribute)
        and arg.value.attr == "node_events"
    ):
        return True
    return (
        isinstance(arg, ast.Call)
        and isinstance(arg.func, ast.Attribute)
        and arg.func.attr == "record"
        and _tail(arg.func.value) == "ring"
    )


def mailbox_puts(source: str, filename: str) -> tuple[int, list[str]]:
    """(mailbox puts found, the ones that hand over an event not drawn from a ring)."""
    found, bad = 0, []
    for node in ast.walk(ast.parse(source, filename)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "put"
            and _tail(node.func.value) == "mailbox"
        ):
            continue
        found += 1
        if not node.args or not _allowed(node.args[0]):
            bad.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found, bad


def scan(root: Path) -> tuple[int, list[str]]:
    found, bad = 0, []
    for path in sorted(root.rglob("*.py")):
        n, b = mailbox_puts(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
        found, bad = found + n, bad + b
    return found, bad


def test_every_publisher_in_the_package_uses_its_ring() -> None:
    found, bad = scan(PACKAGE)
    assert found >= 3  # the runner's publish, its reset, the graph runner's in-graph event
    assert bad == [], "read-done events recorded outside the ring:\n" + "\n".join(bad)


def test_the_scan_catches_a_publisher_that_bypasses_the_ring(tmp_path: Path) -> None:
    (tmp_path / "rogue.py").write_text(
        "class Rogue:\n"
        "    def publish(self):\n"
        "        self.mailbox.put(self.forward_stream.record_event())\n"
        "    def publish_kept(self, event):\n"
        "        self.runner.mailbox.put(event, self.runner.forward)\n"
        "    def fine(self):\n"
        "        self.mailbox.put(self.ring.record(self.forward_stream), None)\n",
        encoding="utf-8",
    )
    found, bad = scan(tmp_path)
    assert found == 3
    assert [line.split(":")[1] for line in bad] == ["3", "5"]
    assert "record_event()" in bad[0]
