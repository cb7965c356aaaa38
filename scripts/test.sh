#!/usr/bin/env bash
# The tests: set up, then lint, check the import layers (lint-imports: pyproject.toml's
# [tool.importlinter] contracts), type-check, build the docs site strictly (a broken link or API
# reference fails it) and run pytest. Every step runs; the exit status is non-zero if any failed.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh

# The plugin packages, not the *.egg-info folders an editable install leaves beside them.
plugin_packages=()
for init in plugins/*/warcore_*/__init__.py examples/*/warcore_*/__init__.py; do
  plugin_packages+=("$(dirname "$init")")
done

failed=()
.venv/bin/ruff check warcore plugins tests examples docs || failed+=(ruff)
PYTHONPATH=plugins/sglang:plugins/vllm .venv/bin/lint-imports --no-cache --no-logo || failed+=(lint-imports)
.venv/bin/mypy warcore "${plugin_packages[@]}" || failed+=(mypy)
# mkdocs.yml: strict, into site/ (ignored). NO_MKDOCS_2_WARNING: mkdocs-material's banner about
# its successor, printed on every build. Not --quiet: it hides the warnings --strict counts.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict || failed+=(mkdocs)
.venv/bin/pytest -q "$@" || failed+=(pytest)

if ((${#failed[@]})); then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "test.sh: all passed" >&2
