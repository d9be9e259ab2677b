#!/usr/bin/env bash
# What to run on a GPU machine after pulling: builds hetjax for the GPU,
# checks the module and its registered GPU handlers, measures the device
# layer, then runs the GPU bridge tests. Prints one JSON line per step.
#
#   scripts/gpu_smoke.sh [cuda|rocm] [--no-tests]
#
# Needs cmake, ninja, nvcc (or hipcc), scikit-build-core, nanobind and a
# jax GPU plugin; downloads nothing.
set -euo pipefail

flavour="${1:-cuda}"
run_tests=1
[[ "${2:-}" == "--no-tests" || "${1:-}" == "--no-tests" ]] && run_tests=0
[[ "$flavour" == "--no-tests" ]] && flavour=cuda
cd "$(dirname "$0")/.."
mkdir -p build

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# 1. The Python package with the GPU handlers inside.
t0=$(now)
HETJAX_GPU="$flavour" python -m pip install --no-build-isolation --no-deps -e . \
  > build/gpu_smoke_pip.log 2>&1 || { tail -40 build/gpu_smoke_pip.log; exit 1; }
echo "{\"step\": \"pip_install\", \"flavour\": \"$flavour\", \"seconds\": $(since "$t0")}"

# 2. One process: the module imports, says its flavour, offers GPU targets.
python - "$flavour" <<'PY'
import json, sys
from hetjax import _native
want = {"cuda": "CUDA", "rocm": "ROCM"}[sys.argv[1]]
targets = {k: sorted(v) for k, v in _native.ffi_targets().items()}
report = {"step": "module", "flavour": _native.flavour(), "targets": targets}
print(json.dumps(report))
assert _native.flavour() == sys.argv[1], report
assert targets.get(want) == ["hetjax_recv", "hetjax_recv_into", "hetjax_send"], report
import jax
platform = "cuda" if sys.argv[1] == "cuda" else "rocm"
print(json.dumps({"step": "jax", "version": jax.__version__,
                  "devices": [str(d) for d in jax.devices(platform)]}))
PY

# 3. The device layer on the GPU: pinned copy bandwidth both ways at 256 MiB,
#    flag-wait release latency, deadline and abort releases.
t0=$(now)
cmake -S . -B "build/probe-$flavour" -G Ninja -DHETJAX_GPU="$flavour" \
  -DHETJAX_PYTHON=OFF > build/gpu_smoke_probe.log 2>&1 \
  && cmake --build "build/probe-$flavour" --target hetjax_device_probe >> build/gpu_smoke_probe.log 2>&1 \
  || { tail -40 build/gpu_smoke_probe.log; exit 1; }
echo "{\"step\": \"probe_build\", \"seconds\": $(since "$t0")}"
"build/probe-$flavour/cc/device/hetjax_device_probe" --bytes $((256 << 20)) --reps 5

# 4. Two islands over the bridge inside jit (GPU+GPU, or GPU+CPU on one GPU).
if (( run_tests )); then
  t0=$(now)
  python -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider 2>&1 | tail -25
  echo "{\"step\": \"gpu_tests\", \"seconds\": $(since "$t0")}"
fi
