#!/usr/bin/env bash
# Create or refresh .venv: Python >= 3.10, torch (installed only when it is not importable, and
# then pinned), warcore with its engine extra (torch: the reference engine, the audit and the
# benchmarks), its three plugins and the example plugins (examples/acme_backend,
# examples/ngram_algorithm) in editable mode, the test tools (the test extra) and the docs tools
# (the docs extra: mkdocs).
# Idempotent: when nothing it installs from has changed, a rerun takes a second or two.
#
#   WARCORE_TORCH_INDEX_URL  index to take torch==2.13.0 from (e.g. a CPU-only wheel index);
#                            unset: pip's configured indexes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PY=$VENV/bin/python
# The three plugins, and the example third-party plugins whose tests are part of the suite.
PLUGINS=(plugins/trtllm_mha plugins/deepseek_v4 plugins/dflash examples/acme_backend
  examples/ngram_algorithm)
TORCH_PIN="torch==2.13.0"

say() { echo "setup: $*" >&2; }

if [[ ! -x $PY ]]; then
  base=$(command -v python3.11 || command -v python3 || true)
  [[ -n $base ]] || { say "no python3.11 or python3 on PATH"; exit 1; }
  say "creating $VENV with $base"
  "$base" -m venv "$VENV"
fi
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { say "$PY is older than Python 3.10"; exit 1; }

pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

# Never let pip pick a torch: an unpinned one can be a multi-GB CUDA build, or replace a
# working install. Only install the pinned one where none is importable.
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  say "installing $TORCH_PIN"
  pip install -q ${WARCORE_TORCH_INDEX_URL:+--index-url "$WARCORE_TORCH_INDEX_URL"} "$TORCH_PIN"
fi

# Skip the editable installs when the metadata they come from is unchanged since the last
# successful run from this checkout (editable installs need no reinstall for code changes).
# The engine integrations' release data (`warcore release sglang|vllm`) without installing
# warcore-sglang or warcore-vllm: those register warcore plugins (the sglang one), and the core
# suite here runs against the three plugins above only. A folder of .venv holds links to the two
# packages (not their trees: an editable build's *.egg-info there would register the plugins)
# and a distribution whose only entry points are `warcore.integrations`; a .pth puts it last on
# sys.path. docs/decisions.md says why; `rm -r .venv/warcore-checkout` undoes it.
link_integrations() {
  local folder=$VENV/warcore-checkout site info
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  info=$folder/warcore_checkout_integrations-0.1.0.dist-info
  mkdir -p "$info"
  ln -sfn "$PWD/plugins/sglang/warcore_sglang" "$folder/warcore_sglang"
  ln -sfn "$PWD/plugins/vllm/warcore_vllm" "$folder/warcore_vllm"
  printf 'Metadata-Version: 2.1\nName: warcore-checkout-integrations\nVersion: 0.1.0\n' \
    >"$info/METADATA"
  printf '[warcore.integrations]\nsglang = warcore_sglang.releases:ENGINE\nvllm = warcore_vllm.releases:ENGINE\n' \
    >"$info/entry_points.txt"
  echo "$PWD/$folder" >"$site/warcore-checkout.pth"
}
link_integrations

stamp=$VENV/.warcore-setup
want=$( { pwd; cat pyproject.toml "${PLUGINS[@]/%//pyproject.toml}" "$0"; } | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] \
  && "$PY" -c 'import warcore, warcore_trtllm_mha, warcore_deepseek_v4, warcore_dflash, warcore_acme, warcore_ngram, pytest, hypothesis, numpy' 2>/dev/null \
  && [[ -x $VENV/bin/ruff && -x $VENV/bin/mypy && -x $VENV/bin/lint-imports ]] \
  && [[ -x $VENV/bin/warcore && -x $VENV/bin/mkdocs ]]; then
  say "up to date"
  exit 0
fi

say "installing warcore and its plugins (editable), the test and the docs tools"
editables=(-e ".[test,engine,docs]")
for plugin in "${PLUGINS[@]}"; do editables+=(-e "$plugin"); done
pip install -q "${editables[@]}"
echo "$want" >"$stamp"
say "done: $("$PY" -c 'import torch, warcore; print("torch", torch.__version__, "/ warcore", warcore.__version__)')"
