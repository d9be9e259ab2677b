#!/usr/bin/env bash
# The cross-island layouts on a machine of four GPUs of one host:
#   collectives  all-reduce, all-gather and reduce-scatter between two islands
#                of two GPUs, a process per GPU (cuda:0-1/2,cuda:2-3/2: each
#                device pair of the two islands exchanges in parallel over its
#                slot channel), the same islands as one process each
#                (cuda:0-1,cuda:2-3: staged through host memory), and four
#                one-GPU islands, against XLA's on one island cuda:0-3;
#   train        llama3.2-1b (bf16, T=2048): (d) data parallelism across the
#                two islands of two GPUs (a process per GPU), (s) the same over
#                four one-GPU islands, and (r) pipeline x data over four
#                one-GPU islands (two stages, two replicas), all against (e),
#                the same data-parallel job on one island cuda:0-3.
#
#   verify       the GPU collective tests, with the four-GPU layouts (two
#                islands of two GPUs, one process each and a process per GPU)
#
#   untuned      llama3-8b and qwen2-7b with no tuning flag over two islands of
#                two GPUs (a), their own plan on one island of four (b), one
#                island of four with FSDP (c) (bench/bench_untuned.py), then
#                the untuned command over every four-GPU layout
#                (bench/defaults_fit.py)
#
#   bench/bench_four_gpus.sh OUT_DIR [collectives|train|verify|untuned|all|install] [STEPS]
#
# Writes JSON, plots and logs into OUT_DIR (bench/gpu_bench_setup.sh builds
# the CUDA flavour first).
set -euo pipefail
out="${1:?usage: bench_four_gpus.sh OUT_DIR [collectives|train|verify|untuned|all|install] [STEPS]}"
what="${2:-all}"
steps="${3:-100}"
source "$(dirname "$0")/gpu_bench_setup.sh"

if [[ "$what" == collectives || "$what" == all ]]; then
  for islands in cuda:0-1/2,cuda:2-3/2 cuda:0-1,cuda:2-3 cuda:0,cuda:1,cuda:2,cuda:3; do
    name="collectives_$(tr -c 'a-z0-9\n' '_' <<< "$islands")"
    python bench/bench_collectives.py --islands "$islands" --reference cuda:0-3 --min-kib 65536 --max-mib 256 \
      --ops psum,all_gather,psum_scatter --out "$out/$name.json" 2>&1 | tee "$out/$name.log" | tail -8
  done
fi

if [[ "$what" == train || "$what" == all ]]; then
  python bench/bench_train.py --devices 4 --models llama3.2-1b --configs edsr --steps "$steps" --seq-len 2048 \
    --batch 32 --microbatches 8 --data builtin --run-timeout 200 --out /tmp/bench_train_four \
    --json "$out/train_edsr.json" 2>&1 | tee "$out/train_edsr.log" | grep -v "^step" | tail -14
  python bench/plot_bench.py "$out/train_edsr.json" "$out/train_edsr.png"
fi

if [[ "$what" == untuned ]]; then
  machine="4 x $(head -1 "$out/gpus.txt" | cut -d, -f1)"
  python bench/bench_untuned.py --islands cuda:0-1,cuda:2-3 --models llama3-8b,qwen2-7b --machine "$machine" \
    --json "$out/untuned.json" --plot "$out/untuned.png" 2>&1 | tee "$out/untuned.log" | tail -8
  python bench/defaults_fit.py 0,1,2,3 --models llama3-8b,qwen2-7b --steps 2 --out "$out/defaults_fit.json" 2>&1 \
    | tee "$out/defaults_fit.log" | tail -14
fi

if [[ "$what" == verify ]]; then
  python -m pytest -q -m gpu tests/gpu/test_collectives_gpu.py tests/gpu/test_collectives_channels.py 2>&1 \
    | tee "$out/verify.log" | tail -5
fi
