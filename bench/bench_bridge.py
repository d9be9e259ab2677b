"""Bridge bandwidth and latency between two local islands (processes).

    python bench/bench_bridge.py [--streams 4] [--max-mib 256] [--out PATH]

Per transport (tcp 1 stream, tcp N streams, shm): one-way bandwidth for
4 KiB .. 256 MiB and ping-pong round-trip latency, through
_native.send_array/recv_array; plus one line of jitted hetjax send/recv to
show what the FFI adds. References from the same run: one plain Python
socket stream over loopback (for tcp) and a single-threaded numpy memcpy
(for shm). Prints tables and writes JSON (default bench/results/bridge_cpu.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

KIB, MIB = 1 << 10, 1 << 20
LATENCY_SIZES = [8, 4 * KIB, 64 * KIB, 1 * MIB]
FFI_SIZES = [4 * KIB, 1 * MIB, 64 * MIB]
BYTES_PER_POINT = 512 * MIB  # fewer iterations for big messages


def sizes_up_to(max_bytes: int) -> list[int]:
    sizes, size = [], 4 * KIB
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def iterations(size: int, lo: int = 3, hi: int = 200) -> int:
    return max(lo, min(hi, BYTES_PER_POINT // size))


# --- worker side: runs as bridge rank 0 (sender) or 1 (receiver) ----------


def _sync(native, me: int, tag: int) -> None:
    """Rank 1 tells rank 0 it has everything (ends a timed section)."""
    flag = np.zeros((), np.uint8)
    if me == 1:
        native.send_array(0, tag, flag)
    else:
        native.recv_array(1, tag, flag)


def native_bandwidth(native, me: int, size: int, tag: int) -> float:
    buf = np.ones(size, np.uint8) if me == 0 else np.empty(size, np.uint8)
    n = iterations(size)
    for _ in range(2):
        (native.send_array(1, tag, buf) if me == 0 else native.recv_array(0, tag, buf))
    _sync(native, me, tag + 1)
    start = time.perf_counter()
    for _ in range(n):
        (native.send_array(1, tag, buf) if me == 0 else native.recv_array(0, tag, buf))
    _sync(native, me, tag + 1)
    return n * size / (time.perf_counter() - start)


def native_round_trip(native, me: int, size: int, tag: int) -> float:
    """Median of timed ping-pongs (the mean of a few hundred on a shared
    2-core machine mostly measures who else ran)."""
    buf = np.ones(size, np.uint8)
    n = max(50, min(2000, BYTES_PER_POINT // 8 // size))
    peer, times = 1 - me, []
    for i in range(n + 20):
        start = time.perf_counter()
        if me == 0:
            native.send_array(peer, tag, buf)
            native.recv_array(peer, tag, buf)
        else:
            native.recv_array(peer, tag, buf)
            native.send_array(peer, tag, buf)
        if i >= 20:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def ffi_bandwidth(bridge, me: int, size: int, tag: int) -> float:
    import jax
    import jax.numpy as jnp

    from hetjax import _native

    if me == 0:
        x = jnp.ones(size, jnp.uint8)
        step = jax.jit(lambda t, x: bridge.send(x, peer=1, tag=tag, token=t))
    else:
        step = jax.jit(lambda t: bridge.recv((size,), jnp.uint8, peer=0, tag=tag, token=t)[1])
    token = bridge.new_token()
    run = (lambda t: step(t, x)) if me == 0 else step
    run(token).block_until_ready()  # compile + warm
    _sync(_native, me, tag + 1)
    n = iterations(size)
    start = time.perf_counter()
    for _ in range(n):
        token = run(token)
    token.block_until_ready()
    _sync(_native, me, tag + 1)
    return n * size / (time.perf_counter() - start)


def ffi_round_trip(bridge, me: int, tag: int) -> float:
    import jax
    import jax.numpy as jnp

    peer = 1 - me

    @jax.jit
    def ping(x, t):
        if me == 0:
            t = bridge.send(x, peer=peer, tag=tag, token=t)
            return bridge.recv((), jnp.int64, peer=peer, tag=tag, token=t)
        y, t = bridge.recv((), jnp.int64, peer=peer, tag=tag, token=t)
        return y, bridge.send(y, peer=peer, tag=tag, token=t)

    x, token, n = jnp.zeros((), jnp.int64), bridge.new_token(), 300
    for i in range(n + 10):
        if i == 10:
            token.block_until_ready()
            start = time.perf_counter()
        x, token = ping(x, token)
    token.block_until_ready()
    return (time.perf_counter() - start) / n


def worker(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    import hetjax.bridge as bridge
    from hetjax import _native

    info = bridge.init()
    me = info.rank
    result = {"bandwidth": {}, "round_trip_s": {}}
    for i, size in enumerate(sizes_up_to(args.max_mib * MIB)):
        result["bandwidth"][size] = native_bandwidth(_native, me, size, 10 * i)
    for i, size in enumerate(LATENCY_SIZES):
        result["round_trip_s"][size] = native_round_trip(_native, me, size, 1000 + i)
    if args.ffi:
        result["ffi_bandwidth"] = {
            size: ffi_bandwidth(bridge, me, size, 2000 + 10 * i)
            for i, size in enumerate(FFI_SIZES)
            if size <= args.max_mib * MIB
        }
        result["ffi_round_trip_s"] = {8: ffi_round_trip(bridge, me, 3000)}
    result["links"] = sorted({link.kind for link in info.links.values()})
    bridge.shutdown()
    if me == 0:
        Path(os.environ["BENCH_RESULT"]).write_text(json.dumps(result))
    return 0


# --- references, measured in this process ---------------------------------


def socket_bandwidth(size: int) -> float:
    """One plain Python stream over loopback: sendall / recv_into."""
    listener = socket.create_server(("127.0.0.1", 0))
    n = iterations(size)
    payload = np.ones(size, np.uint8)

    def send():
        with socket.create_connection(listener.getsockname()) as s:
            for _ in range(n + 1):
                s.sendall(payload)

    sender = threading.Thread(target=send)
    sender.start()
    conn, _ = listener.accept()
    view = memoryview(np.empty(size, np.uint8))

    def recv_one():
        got = 0
        while got < size:
            got += conn.recv_into(view[got:])

    recv_one()  # warm
    start = time.perf_counter()
    for _ in range(n):
        recv_one()
    elapsed = time.perf_counter() - start
    sender.join()
    conn.close()
    listener.close()
    return n * size / elapsed


def memcpy_bandwidth(size: int) -> float:
    src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
    np.copyto(dst, src)
    n = iterations(size)
    start = time.perf_counter()
    for _ in range(n):
        np.copyto(dst, src)
    return n * size / (time.perf_counter() - start)


# --- driver ---------------------------------------------------------------


def run_config(name: str, env: dict, args) -> dict:
    from hetjax.launch import ProcessSpec, run_local

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        argv = [sys.executable, __file__, "--worker", "--max-mib", str(args.max_mib)] + (
            ["--ffi"] if env.pop("FFI", None) else []
        )
        env = {**env, "BENCH_RESULT": out, "HETJAX_TIMEOUT": "300"}
        codes = run_local([ProcessSpec(f"{name}:{r}", argv, env) for r in range(2)], timeout_s=args.timeout)
        if codes != [0, 0]:
            raise SystemExit(f"benchmark {name} failed: exit codes {codes}")
        raw = json.loads(Path(out).read_text())
    return {
        key: ({int(k): v for k, v in value.items()} if isinstance(value, dict) else value) for key, value in raw.items()
    }


def machine() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"node": platform.node(), "cpu": model, "cores": os.cpu_count(), "python": platform.python_version()}


def human(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else (f"{size // KIB} KiB" if size >= KIB else f"{size} B")


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    runs, refs = report["results"], report["references"]
    table = Table(title="one-way bandwidth, GB/s (1e9 B/s)")
    table.add_column("size", justify="right")
    for name in runs:
        table.add_column(name, justify="right")
    table.add_column("ffi (jit, auto)", justify="right")
    table.add_column("python socket", justify="right")
    table.add_column("numpy memcpy", justify="right")
    ffi = runs.get("shm", {}).get("ffi_bandwidth", {})
    for size in report["sizes"]:
        cells = [f"{runs[n]['bandwidth'][size] / 1e9:.2f}" for n in runs]
        cells.append(f"{ffi[size] / 1e9:.2f}" if size in ffi else "")
        cells += [f"{refs['python_socket'][size] / 1e9:.2f}", f"{refs['numpy_memcpy'][size] / 1e9:.2f}"]
        table.add_row(human(size), *cells)
    console.print(table)
    lat = Table(title="round trip (ping-pong, median), microseconds")
    lat.add_column("size", justify="right")
    for name in runs:
        lat.add_column(name, justify="right")
    lat.add_column("ffi (jit, auto)", justify="right")
    ffi_rt = runs.get("shm", {}).get("ffi_round_trip_s", {})
    for size in LATENCY_SIZES:
        cells = [f"{runs[n]['round_trip_s'][size] * 1e6:.1f}" for n in runs]
        cells.append(f"{ffi_rt[size] * 1e6:.1f}" if size in ffi_rt else "")
        lat.add_row(human(size), *cells)
    console.print(lat)
    console.print(report["ratios"])
    for target, verdict in report["targets"].items():
        console.print(f"{'MET ' if verdict['met'] else 'MISSED'} {target}: {verdict['measured']}")


def judge(results: dict, references: dict, sizes: list[int], streams: int) -> tuple[dict, dict]:
    """Ratios against the same-run references, and the bridge's own targets."""
    ratios, targets = {}, {}
    sock, memcpy = references["python_socket"], references["numpy_memcpy"]
    for name, run in results.items():
        bandwidth = run["bandwidth"]
        for size in sizes:
            if size >= 16 * MIB:
                ref = sock if name.startswith("tcp") else memcpy
                label = "python socket" if name.startswith("tcp") else "numpy memcpy"
                ratios[f"{name} / {label} @ {human(size)}"] = bandwidth[size] / ref[size]
    for size, value in results.get("shm", {}).get("ffi_bandwidth", {}).items():
        ratios[f"ffi / native (shm) @ {human(size)}"] = value / results["shm"]["bandwidth"][size]
    if "shm" in results and 64 * MIB in sizes:
        ratio = results["shm"]["bandwidth"][64 * MIB] / memcpy[64 * MIB]
        targets["shm >= 70% of memcpy @ 64 MiB"] = {"measured": ratio, "met": ratio >= 0.7}
        rtt = results["shm"]["round_trip_s"][4 * KIB] * 1e6
        targets["shm 4 KiB round trip < 50 us"] = {"measured": rtt, "met": rtt < 50}
    tcp_n = results.get(f"tcp x{streams}")
    if tcp_n:
        wins = {human(s): tcp_n["bandwidth"][s] / sock[s] for s in sizes if s >= 16 * MIB}
        targets[f"tcp x{streams} beats one python socket (>= 16 MiB)"] = {
            "measured": wins,
            "met": all(r > 1 for r in wins.values()),
        }
    return ratios, targets


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "bench/results/bridge_cpu.json"))
    parser.add_argument(
        "--only", choices=["tcp", "shm"], help="run one transport's configurations (no JSON unless --out is given)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ffi", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    configs = {
        "tcp x1": {"HETJAX_TRANSPORT": "tcp", "HETJAX_TCP_STREAMS": "1"},
        f"tcp x{args.streams}": {"HETJAX_TRANSPORT": "tcp", "HETJAX_TCP_STREAMS": str(args.streams)},
        "shm": {"HETJAX_TRANSPORT": "shm", "FFI": "1"},
    }
    if args.only:
        configs = {name: env for name, env in configs.items() if name.startswith(args.only)}
    results = {name: run_config(name, env, args) for name, env in configs.items()}
    sizes = sizes_up_to(args.max_mib * MIB)
    references = {
        "python_socket": {s: socket_bandwidth(s) for s in sizes},
        "numpy_memcpy": {s: memcpy_bandwidth(s) for s in sizes},
    }
    report_ratios, targets = judge(results, references, sizes, args.streams)
    report = {
        "machine": machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "sizes": sizes,
        "results": results,
        "references": references,
        "ratios": report_ratios,
        "targets": targets,
    }
    print_tables(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
