"""``python -m warcore_sglang.launch_server <sglang arguments>``: sglang's server, with warcore.

The same as ``python -m sglang.launch_server <arguments>``, except that ``WARCORE_SGLANG=1`` is
set first, so sglang's ``load_plugins()`` activates warcore in this process and in every
process sglang starts (scheduler and detokenizer children inherit the environment; they run
``load_plugins()`` first thing). Setting ``WARCORE_SGLANG=1`` yourself and running sglang's own
launcher (or ``sglang serve``, or the ``Engine`` API) does the same.
"""

from __future__ import annotations

import os
import runpy
import sys

from . import ENV_ACTIVATE


def main(argv: list[str] | None = None) -> None:
    os.environ[ENV_ACTIVATE] = "1"
    sys.argv = ["sglang.launch_server", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
