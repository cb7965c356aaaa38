"""``python -m warcore_vllm.audit``: the audit of the installed vLLM (:func:`main`)."""

from warcore.cli import run_command

from . import main

raise SystemExit(run_command("python -m warcore_vllm.audit", main))
