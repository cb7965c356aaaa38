"""Inside a running sglang server: what its barriers did, and whether a declaration holds.

* :mod:`.observe`: the observation points the other two share (publishes, forwards, batches,
  barriers), patched only while a listener is installed;
* :mod:`.trace`: ``WARCORE_SGLANG_TRACE=FILE``, one record per publish and barrier, and its
  summary (``python -m warcore_sglang.audit.trace FILE...``; :mod:`.trace_ranks` compares the
  ranks batch by batch);
* :mod:`.sanitize`: ``WARCORE_SGLANG_SANITIZE``, the WAR sanitizer in the real process
  (``python -m warcore_sglang.audit.sanitize``).

These modules import the standard library only at import time (the entry point imports them
before it knows that warcore itself can be imported); warcore's parts are imported when used.
"""
