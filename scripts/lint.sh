#!/usr/bin/env bash
# Lint, format checks and the type checker, as the pre-commit hooks run them
# (.pre-commit-config.yaml): ruff, ruff format, clang-format, mypy.
# `--fix` rewrites what the formatters can fix instead of failing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The tools come from the [test] extra of this Python, whose scripts folder
# need not be on PATH (pyenv shims, an unactivated venv).
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
if [[ "${1:-}" == "--fix" ]]; then
  ruff check --fix .
  ruff format .
  git ls-files -z '*.cc' '*.h' '*.cu' | xargs -0 clang-format -i
fi
exec pre-commit run --all-files --show-diff-on-failure --color never
