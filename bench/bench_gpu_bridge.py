"""The GPU bridge between two local processes on two GPUs of one host.

    python bench/bench_gpu_bridge.py [--max-mib 256] [--out PATH]
    python bench/bench_gpu_bridge.py --smoke-cpu   # script check, no GPU

Per path (device-direct "ipc", host-staged "host", "off": no slot channel,
the transport's byte path as between hosts, and a CUDA island talking
to a CPU island): one-way time of a message, sizes 4 KiB .. 256 MiB, as half
a ping-pong round trip of jitted hetjax send/recv (programs dispatched ahead
on both sides, so dispatch overlaps the transfer), bytes checked bit for bit
at the end. For small messages also: lock step (every program waits for the
last) and in program (32 round trips unrolled in one jitted program per side:
the devices' and flags' latency without per-program dispatch, as inside a
training step). `--isolate` gives each process only its own GPU, as `hetjax
train` does; HETJAX_BENCH_TRACE=DIR (with HETJAX_BENCH_TRACE_BYTES) profiles a
short extra round of one size. References from the same run: pinned device->host and
host->device copies (cupy: bandwidth timed by events, latency as one copy
plus sync), and jax ppermute (NCCL) over a 2-GPU mesh in one process.
Writes bench/results/gpu_bridge_h200x2.json (machine, command, date, table,
ratios). NCCL_NVLS_ENABLE=0 throughout.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# The CPU bridge bench's size ladder (4 KiB, x4, ...), from the same folder.
from bench_bridge import MIB, sizes_up_to  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


SYNC_LATENCY_MAX = 64 << 10
SYNC_REPS = 200


def reps_for(size: int) -> int:
    return max(5, min(200, (1 << 30) // size))


# --- references: one process, both GPUs -----------------------------------


def copy_reference(sizes):
    import cupy as cp
    import cupyx

    out = {}
    stream = cp.cuda.Stream(non_blocking=True)
    for n in sizes:
        dev = cp.empty(n, cp.uint8)
        host = cupyx.empty_pinned((n,), np.uint8)
        row = {}
        for name, kind, dst, src in (
            ("d2h", 2, host.ctypes.data, dev.data.ptr),
            ("h2d", 1, dev.data.ptr, host.ctypes.data),
        ):
            copy = functools.partial(cp.cuda.runtime.memcpyAsync, dst, src, n, kind, stream.ptr)
            for _ in range(3):
                copy()
            stream.synchronize()
            reps = reps_for(n)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(reps):
                copy()
            stop.record(stream)
            stop.synchronize()
            seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3 / reps
            lat = []
            for _ in range(min(reps, 50)):
                t0 = time.perf_counter()
                copy()
                stream.synchronize()
                lat.append(time.perf_counter() - t0)
            row[name] = {"gbps": n / seconds / 1e9, "latency_us": statistics.median(lat) * 1e6}
        out[n] = row
    return out


def concurrent_copy_reference(sizes):
    """What the host route can reach at best: device->host on GPU 0 and
    host->device on GPU 1 at the same time, into/out of separate pinned
    buffers (they share host memory and the root complex)."""
    import cupy as cp
    import cupyx

    out = {}
    for n in sizes:
        if n < (1 << 20):
            continue
        legs = []
        for device, kind in ((0, 2), (1, 1)):
            with cp.cuda.Device(device):
                dev = cp.empty(n, cp.uint8)
                host = cupyx.empty_pinned((n,), np.uint8)
                stream = cp.cuda.Stream(non_blocking=True)
                dst, src = (host.ctypes.data, dev.data.ptr) if kind == 2 else (dev.data.ptr, host.ctypes.data)
                legs.append((device, stream, dst, src, kind, dev, host))
        reps = reps_for(n)

        def run(count, legs=legs, n=n):
            for device, stream, dst, src, kind, *_ in legs:
                with cp.cuda.Device(device):
                    for _ in range(count):
                        cp.cuda.runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
            for device, stream, *_ in legs:
                with cp.cuda.Device(device):
                    stream.synchronize()

        run(2)
        t0 = time.perf_counter()
        run(reps)
        out[n] = {"gbps": n * reps / (time.perf_counter() - t0) / 1e9}
    return out


def ppermute_reference(sizes):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    swap = jax.jit(
        jax.shard_map(
            lambda a: jax.lax.ppermute(a, "x", [(0, 1), (1, 0)]), mesh=mesh, in_specs=P("x"), out_specs=P("x")
        )
    )
    out = {}
    for n in sizes:
        x = jax.device_put(jnp.ones((2 * n,), jnp.uint8), NamedSharding(mesh, P("x")))
        y = swap(x).block_until_ready()
        reps = reps_for(n)
        t0 = time.perf_counter()
        for _ in range(reps):
            y = swap(y)
        y.block_until_ready()
        seconds = (time.perf_counter() - t0) / reps
        out[n] = {"gbps": n / seconds / 1e9, "us": seconds * 1e6}
    return out


def host_copy_reference(sizes, threads=(1, 4, 8)):
    """Pageable host memcpy (numpy, which releases the GIL), into a buffer
    that is reused and into a fresh one per copy (as XLA:CPU's output buffers
    are: each large one is a new mapping, so its first writes fault pages in),
    on 1..n threads each copying its share. What the CPU end of a GPU <-> CPU
    pair can reach at best."""
    from concurrent.futures import ThreadPoolExecutor

    out = {}
    for n in sizes:
        if n < (1 << 20):
            continue
        src = np.random.default_rng(0).integers(0, 256, n, np.uint8)
        reused = np.empty_like(src)
        row = {}
        for t in threads:
            with ThreadPoolExecutor(t) as pool:

                def copy(dst, src=src, pool=pool, step=-(-n // t)):
                    parts = range(0, len(src), step)
                    list(pool.map(lambda i: np.copyto(dst[i : i + step], src[i : i + step]), parts))

                for name, fresh in (("reused", False), ("fresh", True)):
                    copy(reused)
                    reps = max(3, min(20, (1 << 30) // n))
                    seconds = 0.0
                    for _ in range(reps):
                        dst = np.empty_like(src) if fresh else reused
                        t0 = time.perf_counter()
                        copy(dst)
                        seconds += time.perf_counter() - t0
                    row[f"{name}_{t}t_gbps"] = n * reps / seconds / 1e9
        out[n] = row
    return out


def references_main(sizes):
    import jax

    # The two-GPU references need two GPUs; one-GPU machines get the copies.
    two = len(jax.devices()) >= 2
    result = {
        "copy": copy_reference(sizes),
        "host_copy": host_copy_reference(sizes),
        "concurrent_copy": concurrent_copy_reference(sizes) if two else {},
        "ppermute": ppermute_reference(sizes) if two else {},
    }
    print("RESULT " + json.dumps(result))


# --- bridge worker: rank 0 pings, rank 1 pongs -----------------------------

IN_PROGRAM_ROUNDS = 32
IN_PROGRAM_CALLS = 5


def ping_pong(bridge, me, tag, shape, rounds):
    """Rank 0's program (x -> x after `rounds` round trips) or rank 1's
    (receive, send back, `rounds` times)."""
    import jax.numpy as jnp

    def ping(x):
        token = None
        for _ in range(rounds):
            token = bridge.send(x, peer=1, tag=tag, token=token)
            x, token = bridge.recv(shape, jnp.uint8, peer=1, tag=tag, token=token)
        return x

    def pong():
        token = y = None
        for _ in range(rounds):
            y, token = bridge.recv(shape, jnp.uint8, peer=0, tag=tag, token=token)
            token = bridge.send(y, peer=0, tag=tag, token=token)
        return y, token

    return ping if me == 0 else pong


STREAM_MIN_BYTES = 1 << 20


def one_way(bridge, me, sender, n, tag, want):
    """`sender` streams reps_for(n) messages of n bytes to the other rank, one
    program per message, dispatched ahead. The clock runs at the sender from
    the receiver's "dispatched" message to its "all arrived" message, so it
    holds every transfer plus one small-message latency. Returns the seconds
    per message at the sender; the receiver checks the last message bit for
    bit (raises otherwise) and returns None."""
    import jax
    import jax.numpy as jnp

    other, reps, ctl = 1 - me, reps_for(n), (1,)
    device = jax.devices()[0]
    if me == sender:
        send = jax.jit(lambda x: bridge.send(x, peer=other, tag=tag))
        wait = jax.jit(lambda: bridge.recv(ctl, jnp.uint8, peer=other, tag=tag + 1)[0])
        x = jax.device_put(want, device).block_until_ready()
        for _round in ("warm", "timed"):
            wait().block_until_ready()
            t0 = time.perf_counter()
            for _ in range(reps):
                send(x)
            wait().block_until_ready()
            seconds = (time.perf_counter() - t0) / reps
        return seconds
    signal = jax.jit(lambda a: bridge.send(a, peer=other, tag=tag + 1))
    a = jax.device_put(np.zeros(ctl, np.uint8), device)
    if os.environ.get("BENCH_RECV_INTO") == "1":
        # Each message lands in the buffer the previous one filled (donated).
        recv_into = jax.jit(lambda b: bridge.recv_into(b, peer=other, tag=tag)[0], donate_argnums=0)
        buffer = jax.device_put(np.zeros(n, np.uint8), device)
        for _round in ("warm", "timed"):
            signal(a).block_until_ready()
            for _ in range(reps):
                buffer = recv_into(buffer)
            buffer.block_until_ready()
            signal(a).block_until_ready()
        outs = [buffer]
    else:
        recv = jax.jit(lambda: bridge.recv((n,), jnp.uint8, peer=other, tag=tag)[0])
        for _round in ("warm", "timed"):
            signal(a).block_until_ready()
            outs = [recv() for _ in range(reps)]
            jax.block_until_ready(outs)
            signal(a).block_until_ready()
    if not np.array_equal(np.asarray(outs[-1]), want):
        raise AssertionError(f"one-way {sender}->{me}, {n} bytes: the last message differs")
    return None


def bridge_main(sizes, modes):
    import jax

    import hetjax.bridge as bridge
    from hetjax.pipeline.runtime.profiling import maybe_trace

    info = bridge.init()
    me = info.rank
    link = info.links[1 - me]
    rows = {}
    for i, n in enumerate(sizes):
        rows[n] = {}
        if "stream" not in modes or n < STREAM_MIN_BYTES:
            continue
        want = np.random.default_rng(i).integers(0, 256, n, np.uint8)
        with bridge.translate_errors():
            # Every direction streams twice and the second pass is kept: on
            # the GPU host path the first pass of each direction ran at
            # 25-30 GB/s and the second at 43-46 (2 x H100, 2026-11-26),
            # after the warm round inside one_way. HETJAX_BENCH_SENDERS
            # (default 0,1) orders one pass.
            order = [int(r) for r in os.environ.get("HETJAX_BENCH_SENDERS", "0,1").split(",")]
            for sender in order + order:
                tag = 5000 + 10 * i + 2 * sender
                seconds = one_way(bridge, me, sender, n, tag, want)
                # Rank 0 writes the result: rank 1 reports its sender time.
                if sender == 1:
                    if me == 1:
                        bridge.send(np.float32(seconds), peer=0, tag=tag + 5).block_until_ready()
                    else:
                        seconds = float(bridge.recv((), np.float32, peer=1, tag=tag + 5)[0])
                if me == 0:
                    rows[n][f"from{sender}_gbps"] = n / seconds / 1e9
                    rows[n][f"from{sender}_us"] = seconds * 1e6
    for i, n in enumerate(sizes):
        if "pingpong" not in modes:
            continue
        tag = 1000 + i
        shape = (n,)
        step = jax.jit(ping_pong(bridge, me, tag, shape, 1))
        reps = reps_for(n)
        with bridge.translate_errors():
            # Round 0 warms: compiles, and fills the staging pools as deep as
            # the dispatched-ahead programs need them (pinned allocations
            # take milliseconds each and must not be timed). HETJAX_BENCH_TRACE
            # (a folder) profiles a third, short round of the size
            # HETJAX_BENCH_TRACE_BYTES (default: the smallest).
            trace_dir = os.environ.get("HETJAX_BENCH_TRACE")
            trace_bytes = int(os.environ.get("HETJAX_BENCH_TRACE_BYTES", sizes[0]))
            rounds = [("warm", reps), ("timed", reps)]
            if trace_dir and n == trace_bytes:
                rounds.append(("traced", min(reps, 8)))
            for kind, count in rounds:
                with maybe_trace(0, 0 if kind == "traced" else None, trace_dir, me):
                    if me == 0:
                        want = np.random.default_rng(i).integers(0, 256, n, np.uint8)
                        x = jax.device_put(want, jax.devices()[0])
                        y = step(x).block_until_ready()
                        t0 = time.perf_counter()
                        for _ in range(count):
                            y = step(y)
                        y.block_until_ready()
                        seconds = (time.perf_counter() - t0) / count / 2
                        got = np.asarray(y)  # after the clock: a pageable copy
                        if kind == "timed":
                            rows[n].update(
                                one_way_us=seconds * 1e6,
                                gbps=n / seconds / 1e9,
                                bitwise_ok=bool(np.array_equal(got, want)),
                            )
                    else:
                        outs = [step() for _ in range(count + 1)]
                        jax.block_until_ready(outs)
                        y = None  # rank 1 receives; lock_step passes it through

            # Lock step: every program waits for the previous message,
            # nothing dispatched ahead; half the median round trip.
            def lock_step(y, step=step):
                if me == 0:
                    return step(y).block_until_ready()
                jax.block_until_ready(step())
                return y

            if n <= SYNC_LATENCY_MAX:
                lat = []
                for _ in range(SYNC_REPS):
                    t0 = time.perf_counter()
                    y = lock_step(y)
                    lat.append(time.perf_counter() - t0)
                if me == 0:
                    rows[n]["sync_one_way_us"] = statistics.median(lat) / 2 * 1e6
                # In one program: IN_PROGRAM_ROUNDS round trips unrolled, so
                # the host enqueues them all at once and the time is the
                # devices' and the flags', as inside a training step.
                many = jax.jit(ping_pong(bridge, me, tag, shape, IN_PROGRAM_ROUNDS))
                for _timed in (False, True):
                    t0 = time.perf_counter()
                    out = None
                    for _ in range(IN_PROGRAM_CALLS):
                        out = many(y) if me == 0 else many()
                    jax.block_until_ready(out)
                    seconds = time.perf_counter() - t0
                if me == 0:
                    rows[n]["in_program_one_way_us"] = seconds / (IN_PROGRAM_CALLS * IN_PROGRAM_ROUNDS * 2) * 1e6
    if me == 0:
        print(
            "RESULT "
            + json.dumps(
                {"path": link.gpu_path or "staged", "platforms": [d.platform for d in jax.devices()], "rows": rows}
            )
        )
    bridge.shutdown()


# --- driver ----------------------------------------------------------------


def _parse_result(text: str):
    for line in text.splitlines():
        m = re.search(r"RESULT (\{.*\})$", line)
        if m:
            return json.loads(m.group(1))
    return None


def run_pair(name, envs, sizes, timeout_s, modes="pingpong,stream"):
    from hetjax.launch import ProcessSpec, run_local

    argv = [sys.executable, __file__, "bridge", "--sizes", ",".join(map(str, sizes)), "--modes", modes]
    specs = [ProcessSpec(f"{name}{r}", argv, env) for r, env in enumerate(envs)]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=timeout_s, output=out)
    result = _parse_result(out.getvalue())
    if codes != [0, 0] or result is None:
        sys.stderr.write(out.getvalue()[-4000:])
        return {"error": f"exit codes {codes}"}
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="driver", choices=["driver", "references", "bridge"])
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--sizes", default=None)
    parser.add_argument("--smoke-cpu", action="store_true")
    parser.add_argument("--paths", default="ipc,host,cuda_cpu")
    parser.add_argument("--no-references", action="store_true")
    parser.add_argument(
        "--modes",
        default="pingpong,stream",
        help="pingpong: half a round trip (and latency modes for small sizes); "
        "stream: each direction on its own, messages from 1 MiB up (two passes, the second kept)",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="each process sees only its own GPU (CUDA_VISIBLE_DEVICES), as "
        "hetjax train runs islands; ipc then opens a GPU the process cannot see",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_bridge_h200x2.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else sizes_up_to(args.max_mib * MIB)
    if args.mode == "references":
        return references_main(sizes)
    if args.mode == "bridge":
        return bridge_main(sizes, args.modes.split(","))

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    common = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_TIMEOUT": "60", "NCCL_NVLS_ENABLE": "0"}
    report = {
        "machine": platform.node(),
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        # Tuning knobs the islands inherit (HETJAX_HOST_COPY_NT, HETJAX_GPU_SLOTS, ...).
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HETJAX_")},
        "sizes": sizes,
    }
    if args.smoke_cpu:
        cpu = {**common, "JAX_PLATFORMS": "cpu"}
        report["paths"] = {"cpu_cpu": run_pair("cpu", [cpu, cpu], sizes, 300, args.modes)}
        print(json.dumps(report, indent=1))
        return 0 if "rows" in report["paths"]["cpu_cpu"] else 1

    # Both GPUs visible to every process (CUDA IPC needs the owner's GPU);
    # jax itself is restricted with JAX_CUDA_VISIBLE_DEVICES.
    gpu = [{**common, "JAX_PLATFORMS": "cuda", "JAX_CUDA_VISIBLE_DEVICES": str(r)} for r in range(2)]
    if args.isolate:
        # HETJAX_BENCH_GPUS (default 0,1): the GPU of rank 0 and rank 1.
        order = os.environ.get("HETJAX_BENCH_GPUS", "0,1").split(",")
        gpu = [{**common, "JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": order[r]} for r in range(2)]
    report["references"] = {}
    if not args.no_references:
        refs = subprocess.run(
            [sys.executable, __file__, "references", "--sizes", ",".join(map(str, sizes))],
            env={**os.environ, **common, "JAX_PLATFORMS": "cuda"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        report["references"] = _parse_result(refs.stdout) or {"error": refs.stderr[-2000:]}
    report["paths"] = {}
    paths = args.paths.split(",")
    # off: no slot channel, as between hosts: the transport's byte path.
    for path in ("ipc", "host", "off"):
        if path in paths:
            envs = [{**e, "HETJAX_GPU_PATH": path} for e in gpu]
            report["paths"][path] = run_pair(path, envs, sizes, 300, args.modes)
    # Rank 0 is the CUDA island: "from0" is cuda -> cpu, "from1" cpu -> cuda.
    # cuda_cpu_staged: the same pair on the transport's byte path
    # (HETJAX_GPU_PATH=off), for comparison.
    # cuda_cpu_into: each receive into the buffer the last one filled (hetjax.recv_into, donated).
    cpu_pairs = (
        ("cuda_cpu", {}),
        ("cuda_cpu_into", {"BENCH_RECV_INTO": "1"}),
        ("cuda_cpu_staged", {"HETJAX_GPU_PATH": "off"}),
    )
    for path, extra in cpu_pairs:
        if path in paths:
            envs = [{**gpu[0], **extra}, {**common, "JAX_PLATFORMS": "cpu", **extra}]
            report["paths"][path] = run_pair(path, envs, sizes, 300, args.modes)

    table, ratios = [], {}
    refs = report["references"]
    for n in sizes:
        row = {"bytes": n}
        copy = refs.get("copy", {}).get(str(n)) or refs.get("copy", {}).get(n)
        perm = refs.get("ppermute", {}).get(str(n)) or refs.get("ppermute", {}).get(n)
        if copy:
            row["d2h_gbps"] = copy["d2h"]["gbps"]
            row["h2d_gbps"] = copy["h2d"]["gbps"]
            row["copy_latency_us"] = copy["d2h"]["latency_us"] + copy["h2d"]["latency_us"]
        if perm:
            row["nccl_ppermute_gbps"] = perm["gbps"]
        both = refs.get("concurrent_copy", {}).get(str(n)) or refs.get("concurrent_copy", {}).get(n)
        if both:
            row["concurrent_copy_gbps"] = both["gbps"]
        host_copy = refs.get("host_copy", {}).get(str(n)) or refs.get("host_copy", {}).get(n)
        if host_copy:
            row.update({f"host_memcpy_{k}": v for k, v in host_copy.items()})
        for path, result in report["paths"].items():
            r = result.get("rows", {}).get(str(n)) or result.get("rows", {}).get(n)
            for sender in (0, 1):
                if r and f"from{sender}_gbps" in r:
                    row[f"{path}_from{sender}_gbps"] = r[f"from{sender}_gbps"]
            if r and "gbps" in r:
                row[f"{path}_gbps"] = r["gbps"]
                row[f"{path}_us"] = r["one_way_us"]
                row[f"{path}_bitwise_ok"] = r["bitwise_ok"]
                if "sync_one_way_us" in r:
                    row[f"{path}_sync_us"] = r["sync_one_way_us"]
                if "in_program_one_way_us" in r:
                    row[f"{path}_in_program_us"] = r["in_program_one_way_us"]
        table.append(row)
    big, small = table[-1], table[0]
    if "d2h_gbps" in big and "host_gbps" in big:
        ratios["host_vs_min_copy_bw"] = big["host_gbps"] / min(big["d2h_gbps"], big["h2d_gbps"])
    if "concurrent_copy_gbps" in big and "host_gbps" in big:
        ratios["host_vs_concurrent_copy_bw"] = big["host_gbps"] / big["concurrent_copy_gbps"]
    if "nccl_ppermute_gbps" in big and "ipc_gbps" in big:
        ratios["ipc_vs_nccl_ppermute"] = big["ipc_gbps"] / big["nccl_ppermute_gbps"]
    for path in ("cuda_cpu", "cuda_cpu_into", "cuda_cpu_staged"):
        for sender, copy in ((0, "d2h_gbps"), (1, "h2d_gbps")):
            if f"{path}_from{sender}_gbps" in big and copy in big:
                ratios[f"{path}_from{sender}_vs_{copy[:3]}_bw"] = big[f"{path}_from{sender}_gbps"] / big[copy]
    if "copy_latency_us" in small:
        for path in ("host", "ipc", "cuda_cpu"):
            if f"{path}_us" in small:
                ratios[f"{path}_small_latency_vs_copy_latency"] = small[f"{path}_us"] / small["copy_latency_us"]
            if f"{path}_sync_us" in small:
                ratios[f"{path}_sync_latency_vs_copy_latency"] = small[f"{path}_sync_us"] / small["copy_latency_us"]
            if f"{path}_in_program_us" in small:
                ratios[f"{path}_in_program_latency_vs_copy_latency"] = (
                    small[f"{path}_in_program_us"] / small["copy_latency_us"]
                )
    report["table"], report["ratios"] = table, ratios
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    cols = [
        "bytes",
        "d2h_gbps",
        "h2d_gbps",
        "nccl_ppermute_gbps",
        "ipc_gbps",
        "host_gbps",
        "concurrent_copy_gbps",
        "cuda_cpu_gbps",
        "cuda_cpu_from0_gbps",
        "cuda_cpu_from1_gbps",
        "cuda_cpu_into_from0_gbps",
        "cuda_cpu_into_from1_gbps",
        "cuda_cpu_staged_from0_gbps",
        "cuda_cpu_staged_from1_gbps",
        "host_memcpy_fresh_1t_gbps",
        "host_memcpy_fresh_8t_gbps",
        "copy_latency_us",
        "ipc_us",
        "host_us",
        "cuda_cpu_us",
        "ipc_sync_us",
        "host_sync_us",
        "cuda_cpu_sync_us",
        "ipc_in_program_us",
        "host_in_program_us",
        "cuda_cpu_in_program_us",
    ]
    print(" ".join(f"{c:>14}" for c in cols))
    for row in table:
        print(" ".join(f"{row.get(c, float('nan')):>14.4g}" for c in cols))
    print(json.dumps(ratios, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
