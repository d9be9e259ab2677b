"""All-reduce bus bandwidth across islands (local processes) vs XLA's psum.

    python scripts/bench_collectives.py [--islands 2] [--max-mib 64]
        [--out bench/results/collectives_cpu.json]

Starts one single-device island per --islands as local processes joined by
the bridge and times hetjax's all-reduce (ring and ordered) by size. In the
same run, island 0's process also holds --islands CPU devices and times
jax.lax.psum over them: XLA's own collective on the same number of devices,
the reference. Bus bandwidth = bytes * 2 (n-1) / n / time (the NCCL
convention: what each link carries). Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _time(fn, x, budget_s=1.0, max_reps=50):
    import jax
    jax.block_until_ready(fn(x))  # compile and warm up
    reps, start = 0, time.perf_counter()
    while reps < 3 or (time.perf_counter() - start < budget_s and reps < max_reps):
        jax.block_until_ready(fn(x))
        reps += 1
    return (time.perf_counter() - start) / reps


def worker(args) -> int:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, PartitionSpec as P

    import hetjax.bridge as bridge
    import hetjax.collectives as hc

    info = bridge.init()
    n = info.world_size
    group = hc.all_islands(local_devices=1)
    ref_mesh = Mesh(np.array(jax.devices()[:n]), ("g",))
    xla_psum = jax.jit(jax.shard_map(lambda x: lax.psum(x, "g"), mesh=ref_mesh,
                                     in_specs=P("g"), out_specs=P("g")))
    ours = {alg: jax.jit(lambda x, d=(alg == "ordered"): hc.psum(x, group=group,
                                                                  deterministic=d)[0])
            for alg in ("ring", "ordered")}
    rows = []
    size = 1 << 10
    while size <= args.max_mib << 20:
        elems = size // 4
        x = jnp.asarray(np.random.default_rng(info.rank).standard_normal(elems), jnp.float32)
        row = {"bytes": size}
        bus = 2 * (n - 1) / n
        for alg, fn in ours.items():
            t = _time(fn, x)
            row[f"hetjax_{alg}_us"] = t * 1e6
            row[f"hetjax_{alg}_busbw_GBps"] = size * bus / t / 1e9
        if info.rank == 0:
            xs = jnp.tile(x, n)
            t = _time(xla_psum, xs)
            row["xla_psum_us"] = t * 1e6
            row["xla_psum_busbw_GBps"] = size * bus / t / 1e9
            print(json.dumps(row), flush=True)
        rows.append(row)
        size <<= 2
    if info.rank == 0:
        result = {
            "what": "all-reduce of float32 across islands (one CPU device each), "
                    "bus bandwidth = bytes*2(n-1)/n/time; reference: jax.lax.psum "
                    "over the same number of CPU devices in one process",
            "islands": n, "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                                      "platform": platform.platform(),
                                      "jax": jax.__version__},
            "transport": os.environ.get("HETJAX_TRANSPORT", "auto"),
            "command": " ".join(["python", "scripts/bench_collectives.py", *sys.argv[1:]]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rows": rows,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    bridge.shutdown()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--islands", type=int, default=2)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "bench/results/collectives_cpu.json"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    from hetjax.launch import ProcessSpec, run_local
    argv_worker = [sys.executable, __file__, "--worker", "--max-mib", str(args.max_mib),
                   "--out", args.out]
    env = {"JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.islands}"}
    specs = [ProcessSpec(f"island{k}", argv_worker, {**env, "HETJAX_ISLAND": f"island{k}"})
             for k in range(args.islands)]
    codes = run_local(specs, timeout_s=args.timeout)
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
