"""The hooks a warcore plugin can implement.

A plugin is a module (or object) registered under the entry-point group ``warcore``. Each hook
returns ``None`` to abstain. The core asks every plugin on its own and resolves the answers
itself (see :func:`~warcore.core.resolve_shared_read_boundary`), so registration order never
decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from ._boundary import Declared, SharedReadBoundary
from ._modes import ForwardMode
from ._specs import AlgorithmSpec, BackendSpec, BoundaryContext, FlagSpec, StepFacts

__all__ = ["PROJECT_NAME", "WarcoreSpecs", "hookimpl", "hookspec"]

PROJECT_NAME = "warcore"
"""pluggy project name and entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class WarcoreSpecs:
    """Hook specifications (the namespace registered with ``add_hookspecs``)."""

    @hookspec
    def warcore_shared_read_boundary(
        self, backend: str, forward_mode: ForwardMode, context: BoundaryContext, eager: bool
    ) -> SharedReadBoundary | Declared | None:
        """Declare where ``backend``'s last read of scheduler-shared buffers ends in a forward.

        Called when a runner is built or a graph captured (never per replay), once per
        (backend name, forward mode, context, eager); the answer is cached until a plugin is
        registered or unregistered. ``backend`` is the backend's stable name, so you can
        declare for a backend that lives in another package. ``context.algorithm`` is the
        speculative algorithm's name and ``context.flag(...)`` reads engine switches.

        ``eager`` (take it only if you declare eager paths): a declaration for ``DECODE``,
        ``TARGET_VERIFY`` or ``DRAFT_EXTEND_V2`` describes the *captured graph*; a backend may
        keep a separate eager metadata body, so an eager (uncaptured) forward of those modes
        asks only the hookimpls that take ``eager``, with ``eager=True``. With no eager answer
        the eager forward records after the whole forward (never earlier). Other modes are
        never captured: everyone is asked, with ``eager=True``.

        Return a :class:`~warcore.SharedReadBoundary`, a :class:`~warcore.Declared` (the same,
        scoped to the implementation version range it was audited against: outside that range
        it is not applied), or ``None`` to abstain. Raising, or returning anything else, counts
        as ``UNKNOWN`` and is recorded against your plugin. When plugins disagree the latest
        boundary wins. When nobody answers, a captured ``DECODE`` or ``TARGET_VERIFY`` of a
        backend whose :class:`~warcore.BackendSpec` declares that it follows the metadata
        contract there (``follows_contract``) gets ``IN_REPLAY`` (``contract:<plugin>``), and
        everything else ``UNKNOWN``: being an ``AttentionBackend`` is not a declaration.

        Example plugin (``my_plugin.py``, with
        ``[project.entry-points.warcore] my_plugin = "my_plugin"`` in its ``pyproject.toml``)::

            import warcore
            from warcore import Declared, ForwardMode, SharedReadBoundary


            @warcore.hookimpl
            def warcore_shared_read_boundary(backend, forward_mode, context, eager):
                if backend != "my_backend":
                    return None
                if forward_mode is ForwardMode.EXTEND:
                    # my_backend snapshots the page table in its out-graph init for prefill;
                    # audited against my-backend 1.x.
                    return Declared(SharedReadBoundary.PRE_REPLAY, "my-backend>=1,<2")
                if forward_mode is ForwardMode.DECODE:
                    # The eager body is the same two halves as the graph: both end in the
                    # in-graph init.
                    return SharedReadBoundary.IN_REPLAY
                return None
        """

    @hookspec
    def warcore_fast_path_veto(
        self, forward_mode: ForwardMode, context: BoundaryContext
    ) -> str | None:
        """Veto the fine fence for (``forward_mode``, ``context``): return the reason.

        Called when a runner is built or a graph captured, with the decisions (cached until a
        plugin or a run-time switch changes). A non-empty string keeps the coarse fence for
        that mode and context whatever the backend declares, and the matrix names your plugin
        and your reason. Return ``None`` to let the declarations decide. Raising, or returning
        anything else, counts as a veto (the safe side) and is recorded against your plugin.
        The core vetoes prefill (``EXTEND``) when host or storage KV offload is on (the flags
        ``hicache``, ``hicache_storage``, ``lmcache``) and when the prefill fast path is
        switched off (``WARCORE_PREFILL_FAST_PATH=0``).

        Example plugin::

            import warcore
            from warcore import ForwardMode


            @warcore.hookimpl
            def warcore_fast_path_veto(forward_mode, context):
                # Our KV offloader copies prefill KV on its own stream, ordered only behind
                # the schedule stream: prefill needs the whole-forward barrier.
                if forward_mode is ForwardMode.EXTEND and context.flag("my_offload"):
                    return "my_offload copies prefill KV behind the schedule stream"
                return None
        """

    @hookspec
    def warcore_step_event_owner(self, algorithm: str, facts: StepFacts) -> str | None:
        """Say which runner owns the step's read-done event: ``"target"`` or ``"draft"``.

        Called once per (algorithm, facts) when a worker is built or the facts change; the
        scheduler's barrier takes the owner's event after each step. The owner is the runner
        of the step's last reader of shared buffers. ``facts`` (:class:`~warcore.StepFacts`)
        says whether this rank holds a draft model and whether this step's draft-extend is
        staged for the next step. Return ``None`` for algorithms that are not yours; nobody
        answering means the owner the algorithm's :class:`~warcore.StepSpec` declares (the
        runner of its last reader), else ``"target"``. Raising, answering anything else, or
        plugins disagreeing means no owner: the barrier takes the coarse fence. An answer for
        an algorithm another plugin defines never overrides that plugin's: its step's owner
        counts as its answer, and a disagreement is no owner.

        Example plugin::

            import warcore


            @warcore.hookimpl
            def warcore_step_event_owner(algorithm, facts):
                if algorithm != "my_eagle":
                    return None
                # The draft-extend after verify reads last, unless this rank has no draft
                # model or the draft-extend was staged for the next step.
                if facts.has_draft_model and not facts.draft_extend_staged:
                    return "draft"
                return "target"
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
        (publish nothing, keep the coarse fence) and is recorded; so does a disagreement. With
        no answer, an algorithm whose :class:`~warcore.AlgorithmSpec` has a ``step`` answers
        from it (its last readers' modes), others ``False``; you need this hook only where the
        step cannot say it, and ``warcore check`` reports an answer that contradicts the step.
        An answer for an algorithm another plugin defines never overrides that plugin's: its
        step counts as its answer, and a disagreement is a conflict (``False``).

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

        ``follows_contract`` is a declaration like a hook's answer: give it only for the modes an
        audit showed (the in-graph init is the last shared read; check with ``warcore sanitize
        --backend my_backend``); without it decode and verify are ``UNKNOWN`` (the coarse fence)
        until a plugin declares them, and ``warcore check`` notes it.

        Example plugin::

            import warcore


            def _make(**kwargs):
                from my_package.backend import MyBackend  # an warcore.attention.AttentionBackend

                return MyBackend(**kwargs)


            @warcore.hookimpl
            def warcore_attention_backends():
                return [
                    warcore.BackendSpec(
                        "my_backend",
                        _make,
                        "paged attention, my way",
                        # Audited: decode and verify read req_to_token only in the in-graph init.
                        follows_contract=warcore.CONTRACT_MODES,
                    )
                ]
        """

    @hookspec
    def warcore_speculative_algorithms(self) -> Iterable[AlgorithmSpec] | None:
        """Offer speculative-decoding algorithms: an iterable of :class:`~warcore.AlgorithmSpec`.

        Called once when the algorithm registry is built. ``step`` (a :class:`~warcore.StepSpec`)
        describes a step of the algorithm: its forwards in order, on which runner, which one is
        the last shared reader (so which runner owns the event), whether a drafter proposes
        after the commit, how drafts are accepted. When no plugin answers
        :meth:`warcore_is_war_publish_phase` or :meth:`warcore_step_event_owner` for the
        algorithm, the core answers from the step (provenance ``step:<plugin>``). Without a
        ``step``, ``family`` ``"none"``, ``"eagle"`` or ``"dflash"`` stands for a built-in step;
        any other family is not runnable by the reference engine (``warcore check`` says so).
        ``drafter`` builds what the step needs besides the target (a draft model, or a
        :class:`warcore.engine.drafter.Drafter`).

        Example plugin (k draft-model decodes, then the verify, the last reader)::

            import warcore
            from warcore import ForwardMode, Phase, StepSpec

            STEP = StepSpec(
                prefill=(Phase("target", ForwardMode.EXTEND),
                         Phase("draft", ForwardMode.DRAFT_EXTEND)),
                decode=(Phase("draft", ForwardMode.DECODE, repeat="num_draft"),
                        Phase("target", ForwardMode.TARGET_VERIFY)),
            )


            def _draft_model(target, num_draft, device):
                from my_package.model import make_draft_model  # a TinyLlama for the engine

                return make_draft_model(target.cfg, device)


            @warcore.hookimpl
            def warcore_speculative_algorithms():
                return [warcore.AlgorithmSpec("my_spec", "standalone", "draft model, verify",
                                              drafter=_draft_model, step=STEP)]
        """

    @hookspec
    def warcore_engine_flags(self) -> Iterable[FlagSpec] | None:
        """Declare the engine flags your plugin reads: an iterable of :class:`~warcore.FlagSpec`.

        Called once when the registry is built (after plugin loading, again after a plugin is
        registered or unregistered). ``--flag NAME[=VALUE]`` on the command line and
        ``EngineConfig.flags`` in the API accept only declared flags: the core's own
        (``warcore.core.CORE_FLAGS``) and the ones plugins return here; an unknown name or a
        value of the wrong kind is an error naming the valid ones, because a declaration that
        reads a misspelt flag sees its default and can keep an earlier record point than the
        engine allows. Return every flag your declarations, vetoes or backends read with
        ``context.flag(name)`` that is not a core flag: ``FlagSpec(name, kind, default,
        description)`` with ``kind`` ``bool``, ``int`` or ``str`` and ``default`` what an unset
        flag means (read it with ``context.flag(name, default)``); an ``int`` flag also takes
        ``bounds=(least, most)``, the values it accepts (default ``warcore.core.INT_FLAG_BOUNDS``,
        0 to 2**31 - 1), and on the command line plain decimal digits only. Several plugins may
        declare the same flag if they agree on its kind, default and bounds; a different meaning
        disables it (and ``warcore check`` says so). You cannot redefine a core flag.

        Example plugin (``my_offload.py``, with
        ``[project.entry-points.warcore] my_offload = "my_offload"`` in its
        ``pyproject.toml``)::

            import warcore
            from warcore import FlagSpec, ForwardMode

            MY_OFFLOAD = FlagSpec("my_offload", bool, False, "my KV offloader copies prefill KV")


            @warcore.hookimpl
            def warcore_engine_flags():
                return [MY_OFFLOAD]


            @warcore.hookimpl
            def warcore_fast_path_veto(forward_mode, context):
                # Read where it is declared: --flag my_offload (or my_offload=off).
                if forward_mode is ForwardMode.EXTEND and context.flag(
                    MY_OFFLOAD.name, MY_OFFLOAD.default
                ):
                    return "my_offload copies prefill KV behind the schedule stream"
                return None
        """
