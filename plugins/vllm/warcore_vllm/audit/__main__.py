"""``python -m warcore_vllm.audit``: the audit of the installed vLLM (:func:`main`)."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
