"""The hooks a warcore plugin can implement.

A plugin is a module (or object) registered under the entry-point group ``warcore``. Each hook
returns ``None`` to abstain. The core asks every plugin on its own and resolves the answers
itself (see :mod:`warcore.core._resolve`), so registration order never decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from ._boundary import SharedReadBoundary
from ._modes import ForwardMode
from ._specs import AlgorithmSpec, BackendSpec, BoundaryContext

__all__ = ["PROJECT_NAME", "WarcoreSpecs", "hookimpl", "hookspec"]

PROJECT_NAME = "warcore"
"""pluggy project name and entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class WarcoreSpecs:
    """Hook specifications (the namespace registered with ``add_hookspecs``)."""

    @hookspec
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext
    ) -> SharedReadBoundary | None:
        """Declare where ``backend``'s last read of scheduler-shared buffers ends in a forward.

        Called when a runner is built or a graph captured (never per replay), once per
        (backend name, forward mode, context); the answer is cached until a plugin is
        registered or unregistered. ``backend`` is the backend's stable name, so you can
        declare for a backend that lives in another package. ``context.algorithm`` is the
        speculative algorithm's name and ``context.flag(...)`` reads engine switches.

        Return a :class:`~warcore.SharedReadBoundary`, or ``None`` to abstain. Raising, or
        returning anything else (a string, say), counts as ``UNKNOWN`` and is recorded against
        your plugin. When plugins disagree the latest boundary wins. When nobody answers,
        ``DECODE`` and ``TARGET_VERIFY`` of an :class:`~warcore.attention.AttentionBackend`
        get ``IN_REPLAY`` (the metadata contract) and everything else ``UNKNOWN``.

        Example plugin (``my_plugin.py``, with
        ``[project.entry-points.warcore] my_plugin = "my_plugin"`` in its ``pyproject.toml``)::

            import warcore
            from warcore import ForwardMode, SharedReadBoundary


            @warcore.hookimpl
            def warcore_shared_read_boundary(backend, forward_mode, context):
                # my_backend snapshots the page table in its out-graph init for prefill.
                if backend == "my_backend" and forward_mode is ForwardMode.EXTEND:
                    return SharedReadBoundary.PRE_REPLAY
                return None
        """

    @hookspec
    def warcore_is_war_publish_phase(
        self, algorithm: str, forward_mode: ForwardMode
    ) -> bool | None:
        """Say whether ``forward_mode`` is the step's last reader of shared buffers.

        Called when a runner is built or a graph captured, once per (algorithm, mode). A runner
        publishes a read-done event only for the forward that is its step's last shared reader;
        answer ``True`` for that forward of your algorithm, ``False`` for the others, ``None``
        for algorithms that are not yours. Raising or returning a non-bool counts as ``False``
        (publish nothing, keep the coarse fence) and is recorded; so does a disagreement.

        Example plugin::

            import warcore
            from warcore import ForwardMode


            @warcore.hookimpl
            def warcore_is_war_publish_phase(algorithm, forward_mode):
                if algorithm != "my_spec":
                    return None
                # my_spec has no draft-extend after verify: verify is the last reader.
                return forward_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND)
        """

    @hookspec
    def warcore_attention_backends(self) -> Iterable[BackendSpec] | None:
        """Offer attention backends: an iterable of :class:`~warcore.BackendSpec`.

        Called once when the backend registry is built (after plugin loading, again after a
        plugin is registered or unregistered). Keep the factory lazy: import the backend class
        inside it, so importing your entry-point module stays cheap and does no device work.
        Two plugins offering the same name is an error naming both.

        Example plugin::

            import warcore


            def _make(**kwargs):
                from my_package.backend import MyBackend  # an warcore.attention.AttentionBackend

                return MyBackend(**kwargs)


            @warcore.hookimpl
            def warcore_attention_backends():
                return [warcore.BackendSpec("my_backend", _make, "paged attention, my way")]
        """

    @hookspec
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec] | None:
        """Offer speculative-decoding algorithms: an iterable of :class:`~warcore.AlgorithmSpec`.

        Called once when the algorithm registry is built. ``family`` tells the engine how a
        step of the algorithm runs (``"none"``, ``"eagle"``, ``"dflash"``); its publish phase
        still comes from :meth:`warcore_is_war_publish_phase`.

        Example plugin::

            import warcore


            @warcore.hookimpl
            def warcore_speculative_algorithms():
                return [warcore.AlgorithmSpec("my_spec", "dflash", "block drafter, verify once")]
        """
