#!/usr/bin/env bash
# The main job: set up, then serve a 64-request trace with the reference overlap engine on the
# simulated device and print its report. trtllm_mha by default, so the report shows both record
# points of the fine fence: the in-graph node for decode and PRE_REPLAY for prefill. Extra
# arguments go to `warcore run` (e.g. --backend torch_native --algorithm eagle).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
exec .venv/bin/warcore run --device sim --backend trtllm_mha --requests 64 "$@"
