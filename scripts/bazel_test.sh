#!/usr/bin/env bash
# Builds and runs every Bazel test of the C++ core, offline, with Debian's
# Bazel 4.2.3 (apt: bazel-bootstrap, libgtest-dev). Self-contained: Bazel's
# output root lives under build/bazel of this checkout, and the repositories
# Bazel would download are local stand-ins (WORKSPACE, third_party/bazel/).
# Extra arguments go to `bazel test` (e.g. a target: //cc/transport:all).
# Exits with bazel's exit code.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
output_root="${HETJAX_BAZEL_OUTPUT_ROOT:-${root}/build/bazel}"
mkdir -p "${output_root}"

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=(//...); fi

status=0
bazel --output_user_root="${output_root}" --batch \
  test "${targets[@]}" || status=$?
exit "${status}"
