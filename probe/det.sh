#!/usr/bin/env bash
# Temporary: which flag or layout makes the det-ops crash with bucketed collectives go away.
out="$1"; mkdir -p "$out"
g++ -shared -fPIC -O1 -o /tmp/throw_hook.so probe/throw_hook.cc -ldl && echo hook built >> "$out/summary.txt"
run() {  # name xla_flags extra-args...
  local name=$1 flags=$2; shift 2
  XLA_FLAGS="$flags" timeout 150 hetjax train "$@" --islands cuda:0,cuda:1 --parallel data --steps 3 \
      --batch 16 --microbatches 8 --data builtin --out /tmp/probe_$name --no-progress > "$out/$name.log" 2>&1
  echo "$name rc=$? $(date +%T)" >> "$out/summary.txt"
  grep -m3 -E "Error|error:|raw_hash" "$out/$name.log" | cut -c1-300 >> "$out/summary.txt"
}
D=--xla_gpu_deterministic_ops=true
LD_PRELOAD=/tmp/throw_hook.so run base_det "$D" llama3.2-1b --seq-len 2048
run tiny_det "$D" tiny --seq-len 256
HETJAX_GPU_COLLECTIVES=staged run det_staged "$D" llama3.2-1b --seq-len 2048
run det_onebucket "$D" llama3.2-1b --seq-len 2048 --grad-buckets 100000
run det_nolt "$D --xla_gpu_enable_cublaslt=false" llama3.2-1b --seq-len 2048
cat "$out/summary.txt"
