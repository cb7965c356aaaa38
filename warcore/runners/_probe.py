"""Forward probes: let an audit tool act at a forward's phases in stream order.

The WAR sanitizer poisons the shared buffers at the record point; the read tracer tags each
launched piece of work with its phase. Both need to run *where the runner records*, on the
forward stream, not wherever the host happens to be, so the runners call a probe at exactly
those places. A runner without a probe pays one attribute test per launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warcore.batch import ForwardBatch, StepInput
    from warcore.core import Decision, ForwardMode, RecordPoint
    from warcore.runners._runner import ModelRunner

__all__ = ["ForwardProbe", "Work"]

Work = Callable[[], object]


class ForwardProbe:
    """No-op base class: override what you need.

    Every method is called on the host thread that launches the forward, in launch order, inside
    the forward stream's ``use_stream`` block: device work a method launches lands at that point
    of the forward stream, on ``sim`` and on ``cuda`` alike.
    """

    in_graph = True
    """Whether :meth:`at_record_point` ever acts at an ``IN_GRAPH_NODE``: ``False`` spares the
    capture of the probe graphs (a probe that only watches)."""

    def begin(self, runner: ModelRunner, step: StepInput, decision: Decision) -> bool:
        """A forward is about to start (before ``load_batch``), with the decision it uses.

        Return whether to act at its record point: ``True`` makes the runner call
        :meth:`at_record_point` (and, for ``IN_GRAPH_NODE``, replay the probe graph instead
        of the plain one); ``False`` runs the forward as if no probe were there.
        """
        return False

    def wrap(self, runner: ModelRunner, label: str, fn: Work) -> Work:
        """The runner is about to launch ``fn`` as work ``label`` of the current forward
        (``load_batch``, ``fill_inputs``, ``out_graph_init``, ``in_graph_init``, ``embed``,
        ``layer<i>``, ``sample``); return the work to launch instead. Graph captures call it
        too, so a wrapper captured into a graph runs on every replay."""
        return fn

    def at_record_point(self, runner: ModelRunner, mode: ForwardMode, point: RecordPoint) -> None:
        """Where the runner records the read-done event, right after it recorded it.

        For ``IN_GRAPH_NODE`` this is called while capturing the runner's probe graph (right
        after the planted node), once per bucket, not per replay: launch device work only; the
        graph replays it at the node every time the probe graph runs.
        """

    def end(
        self, runner: ModelRunner, step: StepInput, fb: ForwardBatch, point: RecordPoint
    ) -> None:
        """The body has been launched; its outputs are in ``runner.outputs(fb)`` in stream
        order (before ``emit`` copies them to the host)."""
