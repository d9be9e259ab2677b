#!/usr/bin/env bash
# Installs hetjax into the current Python environment, with what a fresh
# machine lacks. `--test` adds the test tools (GoogleTest, Bazel, torch CPU,
# transformers). The native module is built without build isolation so it
# compiles against the jax that will run it.
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
[[ "${1:-}" == "--test" ]] && with_tests=1

apt_packages=(cmake ninja-build g++)
if (( with_tests )); then
  # GoogleTest and Bazel for the C++ tests; Debian's HIP 5.2 toolchain so CI
  # compiles the ROCm flavour (nothing AMD runs here).
  apt_packages+=(libgtest-dev bazel-bootstrap hipcc libamdhip64-dev rocm-device-libs)
  # The verbs transport's build and its soft-RoCE guest (tests/rdma).
  apt_packages+=(libibverbs-dev rdma-core ibverbs-providers ibverbs-utils perftest
                 python3-pyverbs qemu-system-x86 busybox-static cpio iproute2)
  # Cluster engines for tests/cluster: a SLURM cluster of this machine and Open MPI's mpirun.
  apt_packages+=(slurm-wlm munge openmpi-bin)
fi
if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if (( ${#missing[@]} )); then
    echo "[install] apt: ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
  fi
fi

PY=${PYTHON:-python3}
echo "[install] build requirements"
"$PY" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "jax>=0.10" jaxlib
extra=""
(( with_tests )) && extra="[test]"
echo "[install] hetjax${extra} (builds the native module)"
# The HIP compiler's identification (a ROCm build) leaves empty
# CMakeHIPCompilerId-* folders in TMPDIR: keep them in build/, not in /tmp.
mkdir -p build/tmp
TMPDIR="$PWD/build/tmp" "$PY" -m pip install -q --no-build-isolation -e ".${extra}"
"$PY" -c "import hetjax, hetjax._native as n; print('[install] hetjax ready, native flavour:', n.flavour())"
