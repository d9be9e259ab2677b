#!/usr/bin/env bash
# Collectives and data parallelism on a machine of two GPUs of one host, one island per GPU:
#   collectives  all-reduce, all-gather and reduce-scatter between islands
#                cuda:0,cuda:1 against XLA's on one island cuda:0-1, over the
#                device-direct channels and over host-staged ones
#                (HETJAX_GPU_PATH=host), with the bridge's host-staged
#                send/recv (each direction's second pass), the GPU <-> CPU
#                island pair (its collectives, channels against staged, and
#                its send/recv) and the host link's own ceiling for a two-way
#                exchange (bench_host_link.py, when CuPy is there: bare copies
#                and the hostless copy-engine exchange) beside them;
#   train        `--parallel data` across the two islands against the same job
#                on one island (llama3.2-1b, bf16, T=2048, 100 steps);
#   deterministic  the same two runs under --xla_gpu_deterministic_ops, the
#                gradients bucketed as by default: their losses must be
#                identical at every step (islands take interleaved
#                microbatches);
#   verify       the GPU collective tests, the large pair-kernel one included.
#
#   bench/bench_two_gpus.sh OUT_DIR [collectives|train|deterministic|verify|all|install]
#
# Builds the CUDA flavour first (no download), writes JSON, plots and logs
# into OUT_DIR. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -euo pipefail
out="${1:?usage: bench_two_gpus.sh OUT_DIR [collectives|train|deterministic|verify|all|install]}"
what="${2:-all}"
source "$(dirname "$0")/gpu_bench_setup.sh"

if [[ "$what" == collectives || "$what" == all ]]; then
  for path in ipc host; do
    python bench/bench_collectives.py --islands cuda:0,cuda:1 --reference cuda:0-1 \
      --min-kib 1024 --max-mib 256 --ops psum,all_gather,psum_scatter --gpu-path "$path" \
      --out "$out/collectives_$path.json" 2>&1 | tee "$out/collectives_$path.log" | tail -12
  done
  # The GPU <-> CPU island pair's collectives: the channel path (the CPU
  # island on its host device) against the old staged one.
  python bench/bench_collectives.py --islands cuda:0,cpu --gpu-collectives both \
    --min-kib 1024 --max-mib 256 --ops psum,all_gather,psum_scatter \
    --out "$out/collectives_gpu_cpu.json" 2>&1 | tee "$out/collectives_gpu_cpu.log" | tail -8
  python bench/bench_gpu_bridge.py --isolate --paths host,cuda_cpu,cuda_cpu_into --modes stream \
    --sizes $((64 << 20)),$((256 << 20)) --out "$out/gpu_bridge.json" 2>&1 | tee "$out/gpu_bridge.log" | tail -30
  for mib in 64 256; do
    python bench/bench_host_link.py --mib "$mib" --pipeline 4,8 --out "$out/host_link_${mib}mib.json" 2>&1 | tail -6 || true
  done
fi

if [[ "$what" == verify || "$what" == all ]]; then
  python -m pytest -q -m gpu tests/gpu/test_pair_large.py tests/gpu/test_collectives_channels.py \
    tests/gpu/test_started_collectives.py tests/gpu/test_collectives_gpu.py > "$out/gpu_tests.log" 2>&1 \
    || { tail -40 "$out/gpu_tests.log"; exit 1; }
  tail -3 "$out/gpu_tests.log"
fi

if [[ "$what" == deterministic ]]; then
  XLA_FLAGS=--xla_gpu_deterministic_ops=true python bench/bench_train.py --models llama3.2-1b --configs de \
    --steps 100 --seq-len 2048 --batch 16 --microbatches 8 --data builtin --run-timeout 200 \
    --out /tmp/bench_train_deterministic \
    --json "$out/train_de_deterministic.json" 2>&1 | tee "$out/train_de_deterministic.log" | grep -v "^step" | tail -12
fi

if [[ "$what" == train || "$what" == all ]]; then
  python bench/bench_train.py --models llama3.2-1b --configs de --steps 100 --seq-len 2048 \
    --batch 16 --microbatches 8 --data builtin --run-timeout 280 --out /tmp/bench_train \
    --json "$out/train_de.json" 2>&1 | tee "$out/train_de.log" | grep -v "^step" | tail -12
fi
