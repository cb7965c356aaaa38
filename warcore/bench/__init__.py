"""The benchmarks: functions that measure and return their results (plain data), and format
them as tables; ``warcore bench`` (:mod:`warcore.cli.bench`) parses, prints and writes them.

* :mod:`~warcore.bench.lookup`: a per-replay decision lookup against a method call and a pluggy
  hook call;
* :mod:`~warcore.bench.overlap`: the fences on the reference engine (``overlap``, ``sweep``);
* :mod:`~warcore.bench.startup`: plugin discovery and manager construction;
* :mod:`~warcore.bench.sanitizer`: the WAR sanitizer's cost per forward;
* :mod:`~warcore.bench.plot`: the sweep as a picture (matplotlib, the ``plot`` extra);
* the result files' helpers below (machine, command line, JSON path), shared by all.

May import ``warcore.core``, ``device``, ``batch``, ``attention``, ``runners``, ``engine``
and ``audit``; never ``warcore.cli``. Heavy imports (torch, the engine, the sanitizer) stay
inside the functions that measure.
"""

from warcore.bench._common import (
    RESULTS_DIR,
    command_line,
    machine_info,
    result_path,
    write_result,
)

__all__ = ["RESULTS_DIR", "command_line", "machine_info", "result_path", "write_result"]
