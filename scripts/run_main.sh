#!/usr/bin/env bash
# The main job: set up, then run the reference engine on the simulated device.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
exec .venv/bin/warcore run --device sim "$@"
