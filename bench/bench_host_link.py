"""How fast a GPU reaches pinned host memory, by who moves the bytes.

    python bench/bench_host_link.py [--mib 256] [--out bench/results/host_link.json]

The host-staged path (a CUDA island beside a ROCm one, HETJAX_GPU_PATH=host)
crosses PCIe twice: the sender's GPU writes into a pinned host buffer and the
receiver's GPU reads it. The pair kernel does both with SM loads and stores;
copy engines are the other way. This times each on every GPU, alone and both
directions at once, so the design of that path rests on measured rates:

  sm_store / sm_load   a kernel storing to / loading from pinned host memory
  ce_d2h / ce_h2d      cudaMemcpyAsync device -> host / host -> device
  sm_both / ce_both    a store and a load kernel (two copies) at once, on
                       two streams of one GPU: one GPU's half of an exchange
  sm_store_ce_h2d,     the mixes: one direction by SMs, the other by a copy
  ce_d2h_sm_load       engine, at once on one GPU
  pair_sm / pair_ce    GPU 0 writes while GPU 1 reads (and the reverse
                       pairing), SMs or copy engines: one direction of an
                       exchange between two GPUs through host memory
  all_sm / all_ce      both GPUs storing and loading at once (four
                       streams): both directions of that exchange
  pipeline             (--pipeline) the exchange as the copy-engine pair
                       exchange runs it (cc/ffi/gpu/pair_copies.h), with no
                       host in the way: per GPU a publish stream (wait for a
                       free buffer, copy a chunk into the peer's, raise its
                       flag) and a consume stream (wait, copy into scratch,
                       free, add), through `depth` host buffers a direction,
                       everything enqueued behind one gate, then released

GB/s per direction, over 10 rounds enqueued back to back.
Needs CuPy and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_KERNELS = r"""
extern "C" __global__ void store_host(int4* dst, unsigned long long vectors) {
  const int4 v = make_int4(threadIdx.x, blockIdx.x, 1, 2);
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < vectors;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    dst[i] = v;
  }
}
extern "C" __global__ void load_host(const int4* src, unsigned long long vectors, int* sink) {
  int acc = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < vectors;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const int4 v = __ldcv(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) sink[0] = acc;  // keeps the loads
}
extern "C" __global__ void wait_at_least(const unsigned long long* flag, unsigned long long target) {
  volatile const unsigned long long* word = flag;
  while (*word < target) __nanosleep(100);
  __threadfence_system();
}
extern "C" __global__ void raise_to(unsigned long long* flag, unsigned long long value) {
  __threadfence_system();
  *(volatile unsigned long long*)flag = value;
}
extern "C" __global__ void add_into(const float4* a, float4* b, unsigned long long vectors) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < vectors;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    const float4 x = a[i];
    float4 y = b[i];
    y.x += x.x; y.y += x.y; y.z += x.z; y.w += x.w;
    b[i] = y;
  }
}
"""

REPS = 10


def _timed(streams, launch) -> float:
    """Seconds per round of `launch()` (which enqueues on `streams`, of one
    or two GPUs): REPS rounds back to back after two warm ones, timed on
    the host from the first enqueue to the last stream's end (a round moves
    hundreds of MiB, milliseconds, so the enqueues are noise)."""
    import time

    def sync():
        for s in streams:
            s.synchronize()

    for _ in range(2):
        launch()
    sync()
    t0 = time.perf_counter()
    for _ in range(REPS):
        launch()
    sync()
    return (time.perf_counter() - t0) / REPS


class _Gpu:
    """One GPU's buffers, kernels and two streams."""

    def __init__(self, index: int, n: int):
        import cupy as cp
        import cupyx
        import numpy as np

        self.index, self.n = index, n
        with cp.cuda.Device(index):
            self.module = cp.RawModule(code=_KERNELS)
            self.store, self.load = self.module.get_function("store_host"), self.module.get_function("load_host")
            self.dev = [cp.zeros(n, cp.uint8), cp.zeros(n, cp.uint8)]
            self.host = [cupyx.empty_pinned((n,), np.uint8), cupyx.empty_pinned((n,), np.uint8)]
            self.sink = cp.zeros(1, cp.int32)
            self.streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
            sms = cp.cuda.runtime.getDeviceProperties(index)["multiProcessorCount"]
        self.grid = (sms * 4,)

    def sm_store(self, stream: int, buffer: int = 0) -> None:
        import cupy as cp

        with cp.cuda.Device(self.index), self.streams[stream]:
            self.store(self.grid, (512,), (self.host[buffer].ctypes.data, cp.uint64(self.n // 16)))

    def sm_load(self, stream: int, buffer: int = 1) -> None:
        import cupy as cp

        with cp.cuda.Device(self.index), self.streams[stream]:
            self.load(self.grid, (512,), (self.host[buffer].ctypes.data, cp.uint64(self.n // 16), self.sink))

    def ce(self, stream: int, kind: str, buffer: int) -> None:
        import cupy as cp

        dst, src = (self.host[buffer].ctypes.data, self.dev[buffer].data.ptr)
        if kind == "h2d":
            dst, src = src, dst
        code = 2 if kind == "d2h" else 1
        with cp.cuda.Device(self.index):
            cp.cuda.runtime.memcpyAsync(dst, src, self.n, code, self.streams[stream].ptr)


def measure(n: int) -> dict:
    import cupy as cp

    gpus = [_Gpu(i, n) for i in range(cp.cuda.runtime.getDeviceCount())]
    result: dict = {"per_gpu": {}, "pairs": {}}
    for g in gpus:
        one = [g.streams[0]]
        both = g.streams
        rates = {
            "sm_store": _timed(one, lambda g=g: g.sm_store(0)),
            "sm_load": _timed(one, lambda g=g: g.sm_load(0)),
            "ce_d2h": _timed(one, lambda g=g: g.ce(0, "d2h", 0)),
            "ce_h2d": _timed(one, lambda g=g: g.ce(0, "h2d", 1)),
            "sm_both": _timed(both, lambda g=g: (g.sm_store(0, 0), g.sm_load(1, 1))),
            "ce_both": _timed(both, lambda g=g: (g.ce(0, "d2h", 0), g.ce(1, "h2d", 1))),
            "sm_store_ce_h2d": _timed(both, lambda g=g: (g.sm_store(0, 0), g.ce(1, "h2d", 1))),
            "ce_d2h_sm_load": _timed(both, lambda g=g: (g.ce(0, "d2h", 0), g.sm_load(1, 1))),
        }
        result["per_gpu"][g.index] = {k: n / t / 1e9 for k, t in rates.items()}
    for writer, reader in ((a, b) for a in gpus for b in gpus if a is not b):
        streams = [writer.streams[0], reader.streams[0]]
        pair = {
            "pair_sm": _timed(streams, lambda w=writer, r=reader: (w.sm_store(0, 0), r.sm_load(0, 1))),
            "pair_ce": _timed(streams, lambda w=writer, r=reader: (w.ce(0, "d2h", 0), r.ce(0, "h2d", 1))),
        }
        result["pairs"][f"{writer.index}->{reader.index}"] = {k: n / t / 1e9 for k, t in pair.items()}
    if len(gpus) >= 2:
        # Both GPUs, both directions at once: a two-GPU exchange through host memory.
        a, b = gpus[:2]
        streams = [*a.streams, *b.streams]
        every = {
            "all_sm": _timed(streams, lambda: (a.sm_store(0, 0), a.sm_load(1, 1), b.sm_store(0, 0), b.sm_load(1, 1))),
            "all_ce": _timed(
                streams, lambda: (a.ce(0, "d2h", 0), a.ce(1, "h2d", 1), b.ce(0, "d2h", 0), b.ce(1, "h2d", 1))
            ),
        }
        result["exchange"] = {k: n / t / 1e9 for k, t in every.items()}
    return result


def measure_pipeline(total: int, chunk: int, depth: int, rounds: int = 5) -> float:
    """GB/s a direction of the copy-engine exchange between GPUs 0 and 1
    (module docstring, `pipeline`), `total` bytes each way; the median of
    `rounds` - 1 timed rounds after one warm one. Checks the sums."""
    import time

    import cupy as cp
    import cupyx
    import numpy as np

    chunks = total // chunk
    # flags[0]: the gate; flags[8g + 1]: chunks pushed into GPU g's buffers;
    # flags[8g + 2]: chunks of GPU g's pushes the peer has consumed.
    flags = cupyx.empty_pinned((24,), np.uint64)
    flags[:] = 0
    inbound = [cupyx.empty_pinned((depth * chunk,), np.uint8) for _ in range(2)]

    def flag(g, which):
        return cp.uint64(flags.ctypes.data + 8 * (8 * g + which))

    gpus = []
    for g in range(2):
        with cp.cuda.Device(g):
            module = cp.RawModule(code=_KERNELS)
            gpus.append(
                {
                    "wait": module.get_function("wait_at_least"),
                    "raise": module.get_function("raise_to"),
                    "add": module.get_function("add_into"),
                    "src": cp.ones(total // 4, cp.float32),
                    "out": cp.zeros(total // 4, cp.float32),
                    "scratch": cp.empty(depth * chunk, cp.uint8),
                    "publish": cp.cuda.Stream(non_blocking=True),
                    "consume": cp.cuda.Stream(non_blocking=True),
                    "blocks": cp.cuda.runtime.getDeviceProperties(g)["multiProcessorCount"] * 4,
                }
            )
    one = ((1,), (1,))
    times = []
    for r in range(rounds):
        flags[0] = 0
        for g, d in enumerate(gpus):
            peer = 1 - g
            with cp.cuda.Device(g):
                for stream in (d["publish"], d["consume"]):
                    with stream:
                        d["wait"](*one, (flag(0, 0), cp.uint64(1)))
                for k in range(chunks):
                    n = r * chunks + k
                    slot = (n % depth) * chunk
                    with d["publish"]:
                        if n + 1 > depth:
                            d["wait"](*one, (flag(g, 2), cp.uint64(n + 1 - depth)))
                        cp.cuda.runtime.memcpyAsync(
                            inbound[peer].ctypes.data + slot, d["src"].data.ptr + k * chunk, chunk, 2, d["publish"].ptr
                        )
                        d["raise"](*one, (flag(peer, 1), cp.uint64(n + 1)))
                    with d["consume"]:
                        d["wait"](*one, (flag(g, 1), cp.uint64(n + 1)))
                        cp.cuda.runtime.memcpyAsync(
                            d["scratch"].data.ptr + slot, inbound[g].ctypes.data + slot, chunk, 1, d["consume"].ptr
                        )
                        d["raise"](*one, (flag(peer, 2), cp.uint64(n + 1)))
                        d["add"](
                            (d["blocks"],),
                            (512,),
                            (d["scratch"].data.ptr + slot, d["out"].data.ptr + k * chunk, cp.uint64(chunk // 16)),
                        )
        t0 = time.perf_counter()
        flags[0] = 1
        for g, d in enumerate(gpus):
            with cp.cuda.Device(g):
                d["publish"].synchronize()
                d["consume"].synchronize()
        times.append(time.perf_counter() - t0)
    for g, d in enumerate(gpus):
        with cp.cuda.Device(g):
            if not bool((d["out"] == rounds).all()):
                raise SystemExit(f"pipeline: GPU {g}'s sums are wrong")
    timed = sorted(times[1:])
    return total / timed[len(timed) // 2] / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="bytes moved per transfer, MiB")
    parser.add_argument("--out", default=str(ROOT / "bench/results/host_link.json"))
    parser.add_argument(
        "--pipeline",
        default="",
        metavar="MIB,...",
        help="also time the copy-engine exchange (two GPUs) at these chunk sizes, MiB, depth 4, --mib each way",
    )
    args = parser.parse_args(argv)
    try:
        import cupy as cp
    except ImportError:
        raise SystemExit("bench_host_link.py needs CuPy (pip install cupy-cuda12x) and a CUDA GPU") from None
    result = measure(args.mib << 20)
    if args.pipeline:
        result["pipeline_depth4"] = {
            f"{mib} MiB chunks": measure_pipeline(args.mib << 20, mib << 20, 4)
            for mib in (int(m) for m in args.pipeline.split(","))
        }
    gpus = [cp.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(cp.cuda.runtime.getDeviceCount())]
    out = {
        "what": __doc__.split("\n\n")[2].strip(),
        "bytes": args.mib << 20,
        "machine": {"node": platform.node(), "platform": platform.platform(), "gpus": gpus},
        "command": " ".join(["python", "bench/bench_host_link.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **result,
    }
    for gpu, rates in result["per_gpu"].items():
        print(f"GPU {gpu}: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()) + " GB/s")
    if "exchange" in result:
        print("both GPUs, both directions: " + ", ".join(f"{k} {v:.1f}" for k, v in result["exchange"].items()))
    for chunks, rate in result.get("pipeline_depth4", {}).items():
        print(f"copy-engine exchange, {chunks}, depth 4: {rate:.1f} GB/s a direction")
    for pair, rates in result["pairs"].items():
        print(f"{pair}: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()) + " GB/s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
