#!/usr/bin/env bash
# Builds and runs every Bazel test of the C++ core, offline, with Debian's
# Bazel 4.2.3 (apt: bazel-bootstrap, libgtest-dev). Self-contained: Bazel's
# output root lives under build/bazel of this checkout, and the repositories
# Bazel would download are local stand-ins (WORKSPACE, third_party/bazel/).
# Extra arguments go to `bazel test`: flags (--nocache_test_results) and/or
# targets (//cc/transport:all); without a target, everything (//...).
# Exits with bazel's exit code.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
output_root="${HETJAX_BAZEL_OUTPUT_ROOT:-${root}/build/bazel}"
mkdir -p "${output_root}"

args=("$@")
has_target=0
for arg in "$@"; do
  if [[ "${arg}" != -* ]]; then has_target=1; fi
done
if [[ ${has_target} -eq 0 ]]; then args+=(//...); fi

status=0
bazel --output_user_root="${output_root}" --batch \
  test "${args[@]}" || status=$?
exit "${status}"
