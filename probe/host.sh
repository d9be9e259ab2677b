#!/usr/bin/env bash
# Temporary: the host-staged all-reduce by pair kernel vs messages with bigger pieces.
out=$1; mkdir -p $out
one() {  # name env...
  local name=$1; shift
  env "$@" python scripts/bench_collectives.py --islands cuda:0,cuda:1 --reference cuda:0-1 --gpu-path host \
    --min-kib 65536 --max-mib 256 --ops psum,all_gather,psum_scatter --out $out/$name.json > $out/$name.log 2>&1
  echo "== $name rc=$?"; grep -E "^\| [0-9]" $out/$name.log
}
one pair HETJAX_GPU_PAIR_HOST=1
one msg16 HETJAX_GPU_PAIR_HOST=0
one msg64 HETJAX_GPU_PAIR_HOST=0 HETJAX_GPU_PIECE_BYTES=67108864
one msg32 HETJAX_GPU_PAIR_HOST=0 HETJAX_GPU_PIECE_BYTES=33554432
one msg64s16 HETJAX_GPU_PAIR_HOST=0 HETJAX_GPU_PIECE_BYTES=67108864 HETJAX_GPU_SLOT_BYTES=16777216 HETJAX_GPU_SLOTS=8
python scripts/bench_gpu_bridge.py --isolate --paths host --modes stream --sizes 67108864,268435456 --out $out/bridge_host.json > $out/bridge.log 2>&1
echo "== bridge rc=$?"; python -c "
import json;d=json.load(open('$out/bridge_host.json'));print(json.dumps(d['paths'])[:600]); print({k:d['references'][k] for k in ('concurrent_copy',)})"
