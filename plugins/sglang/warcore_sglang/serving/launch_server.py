"""``python -m warcore_sglang.serving.launch_server <sglang arguments>``: sglang's server, with
warcore.

The same as ``python -m sglang.launch_server <arguments>``, except that ``WARCORE_SGLANG=1`` is
set first, so that sglang's ``load_plugins()`` activates warcore in every scheduler process sglang
starts (the children inherit the environment and run ``load_plugins()`` first thing; the
launcher and the detokenizer, which build no model runner, leave it to them and say so).
Setting ``WARCORE_SGLANG=1`` yourself and running sglang's own
launcher (or ``sglang serve``, or the ``Engine`` API) does the same, except for one check:

Because you asked for warcore by name, this launcher refuses to start a server without it
(exit 2, before sglang starts) when the package ``warcore`` is shadowed: ``python -m`` puts the
working directory first on ``sys.path``, and a folder ``warcore/`` without ``__init__.py``
there (a copy of the repository, say) would be imported instead of the installed package. With
sglang's own launcher the same case logs one ERROR line per process, and sglang's own
declarations apply.
"""

from __future__ import annotations

import os
import runpy
import sys

from .. import ENV_ACTIVATE, shadowed


def main(argv: list[str] | None = None) -> None:
    where = shadowed("warcore")
    if where is not None:
        print(
            "warcore_sglang.serving.launch_server: not starting: the package 'warcore' is "
            f"shadowed by the folder {where} (no __init__.py; python -m puts the working directory "
            f"{os.getcwd()} first on sys.path), so warcore could not be active. Run from another "
            "directory or rename that folder.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    os.environ[ENV_ACTIVATE] = "1"
    sys.argv = ["sglang.launch_server", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
