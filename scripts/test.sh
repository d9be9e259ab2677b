#!/usr/bin/env bash
# The whole test suite on a fresh CPU machine: install, the linters, then
# pytest. pytest also builds and runs the C++ tests (CMake/ctest and Bazel)
# and compiles the GPU flavours, so its closing line is the verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install.sh --test
./scripts/lint.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Two workers (pytest-xdist), each given whole groups of tests that share
# state (tests/worker_groups.py); flags given here come after and win (-n 0: one process).
exec python3 -m pytest -q -n 2 "$@"
