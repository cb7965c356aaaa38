"""A real sglang ``Engine`` or HTTP server on this machine, and what warcore costs in it.

* :mod:`.launch_server`: ``python -m warcore_sglang.serving.launch_server ...`` is sglang's own
  ``launch_server`` with ``WARCORE_SGLANG=1`` (refusing to start where warcore is shadowed);
* :mod:`.harness`: the test harness shipped with the plugin: a tiny ``config.json``-only model,
  sglang's CPU settings, a real ``Engine`` or HTTP server started and stopped by its pid, with
  bounded waits (the project's server tests, the sanitizer's command and the benchmarks use it);
* :mod:`.bench`: ``python -m warcore_sglang.serving.bench``, sglang's per-execute resolution
  against warcore's lookup, and the empty-method floor;
* :mod:`.bench_server`: ``python -m warcore_sglang.serving.bench_server``, per batch inside a
  real server's scheduler (the meter) and its start-up.
"""
