#!/usr/bin/env bash
# The GPU checks, in one bounded run (< 8 minutes on one H100/H200): the CUDA-marked tests, the
# reference engine on the cuda device, then the overlap benchmark on CUDA (its JSON goes to
# benchmarks/results/overlap_cuda.json, and to $OUT when set). Needs the set-up of
# scripts/setup.sh and a CUDA torch.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
status=0
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('cuda', torch.version.cuda, torch.cuda.get_device_name())" || exit 1
timeout 200 "$PY" -m pytest -q -m cuda tests/ || status=1
timeout 60 "$PY" -m warcore run --device cuda --requests 64 --progress never || status=1
timeout 60 "$PY" -m warcore run --device cuda --backend trtllm_mha --requests 64 --progress never || status=1
if "$PY" -c "import flashinfer" 2>/dev/null; then
  timeout 90 "$PY" -m warcore run --device cuda --backend flashinfer --dtype float16 --requests 64 --progress never || status=1
else
  echo "flashinfer not installed: skipped its run"
fi
# The overlap benchmark on the GPU: real streams, events and graphs, and real scheduler device
# work (a pinned H2D copy of 40% of the forward's measured time per step). CUDA reports no
# device spans, so idle times are absent from this result; tokens/s ratios are the measurement.
mkdir -p benchmarks/results
timeout 200 "$PY" -m warcore bench overlap --device cuda --requests 48 --repeat 5 --quiet \
  --json benchmarks/results/overlap_cuda.json || status=1
if [ -n "${OUT:-}" ] && [ -f benchmarks/results/overlap_cuda.json ]; then
  cp benchmarks/results/overlap_cuda.json "$OUT/"   # the device runner brings back $OUT
fi
exit $status
