"""Collective bus bandwidth across islands (local processes) vs XLA's own.

    python bench/bench_collectives.py [--islands cpu,cpu] [--max-mib 64]
        [--out bench/results/collectives_cpu.json]
    # 4 GPUs: two islands of two GPUs vs one island of four
    python bench/bench_collectives.py --islands cuda:0-1,cuda:2-3 --reference cuda:0-3 \\
        --max-mib 256 --out bench/results/collectives_h200x4.json
    # 2 GPUs: one island of two GPUs and a CPU island of two devices
    python bench/bench_collectives.py --islands cuda:0-1,cpu*2 --reference cuda:0-1 \\
        --max-mib 256 --out bench/results/collectives_h200x2.json
    # 2 GPUs as two islands: the GPU channel path (device-direct, then
    # host-staged channels) and the old staged path, vs psum on cuda:0-1
    python bench/bench_collectives.py --islands cuda:0,cuda:1 --reference cuda:0-1 \\
        --min-kib 16384 --max-mib 256 --gpu-collectives both \\
        --out bench/results/collectives_gpu_channels.json

Starts one process per island of --islands (the `hetjax train` syntax; a
number N means N one-device CPU islands), joined by the bridge, and times
hetjax's hierarchical psum (ring and ordered) over every device of every
island, by size per device; `--ops psum,all_gather,psum_scatter` adds the
other two (each against the same jax.lax op). Each size is the median of
10-20 calls; with one-device islands every result is checked against numpy
before it is timed. `--trace DIR` profiles five calls of each program.

On GPU islands --gpu-collectives picks how the bridge part moves
(HETJAX_GPU_COLLECTIVES): over the GPU slot channels (`channels`, the
default; --gpu-path auto/ipc/host picks the channel kind, off none, as
between hosts: staged bridge messages, still only enqueued), staged through
pinned host memory (`staged`), or `both` in the same run (staged columns are
prefixed hetjax_staged_). Then, in the same run, one process holding the
--reference island (default: the islands' devices as one island where they
share a platform) times the same jax.lax ops over its devices: XLA's own
collectives, the reference. Bus bandwidth follows NCCL's convention (what
each link carries): bytes per device times 2(G-1)/G for psum, G-1 for
all_gather, (G-1)/G for psum_scatter, over the time. Every rank runs the
same number of repetitions per size (a collective cannot stop early on one
island only). The JSON records the machine, the command and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _sizes(args) -> list[int]:
    sizes, size = [], args.min_kib << 10
    while size <= args.max_mib << 20:
        sizes.append(size)
        size <<= 2
    return sizes


def _reps(size: int) -> int:
    """Repetitions per size, the same on every rank: about 1 GiB moved per
    size, at least 10 and at most 20 timed calls."""
    return int(min(20, max(10, (1 << 30) // size)))


def _timed(fn, x, reps: int, starts: list | None = None) -> float:
    """The median of `reps` timed calls, each dispatched and waited for: one
    late call (a page fault, the other process descheduled) moves a mean of
    a few calls by tens of percent, the median not. With `starts`, appends
    each timed call's start (time.time_ns(): one clock for every process of
    the host) so the islands' start skew can be told apart from the op."""
    import jax

    # Compile and warm up: HETJAX_BENCH_WARMUP calls (default 1).
    for _ in range(int(os.environ.get("HETJAX_BENCH_WARMUP", "1"))):
        jax.block_until_ready(fn(x))
    times = []
    for _ in range(reps):
        if starts is not None:
            starts.append(time.time_ns())
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _start_skew_us(starts_by_rank: list[list[int]]) -> float:
    """Median over calls of (latest start - earliest start) across the
    island processes, in us: how far apart the islands dispatched the same
    call. The op cannot finish before the last island arrives."""
    calls = zip(*starts_by_rank, strict=True)
    return float(np.median([(max(c) - min(c)) / 1e3 for c in calls]))


# Bus bandwidth per op, NCCL's convention (what each link carries), from the
# bytes of input per device: all-reduce 2(G-1)/G of them, all-gather (G-1)
# (its output is G times its input), reduce-scatter (G-1)/G.
_BUS_FACTOR = {
    "psum": lambda g: 2 * (g - 1) / g,
    "all_gather": lambda g: g - 1,
    "psum_scatter": lambda g: (g - 1) / g,
}
OPS = tuple(_BUS_FACTOR)


def _busbw(size: int, devices: int, seconds: float, op: str = "psum") -> float:
    return size * _BUS_FACTOR[op](devices) / seconds / 1e9


def _ops(args) -> list[str]:
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown or not ops:
        raise SystemExit(f"--ops: expected a comma list of {', '.join(OPS)}, got {args.ops!r}")
    return ops


def _device_input(size: int, device: int) -> np.ndarray:
    """Global device `device`'s input: size bytes of float32 unit normals."""
    return np.random.default_rng(device).standard_normal(size // 4).astype(np.float32)


def _per_device_input(mesh, axis: str, size: int, first_device: int):
    """_device_input of each of the mesh's devices (global indices from
    `first_device` on), sharded over the mesh axis. A multi-process island's
    array is not one process's alone: each process fills its own shards."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    n = size // 4

    def shard(index):
        (rows,) = index  # slice(None) on a mesh of one device
        return _device_input(size, first_device + (rows.start or 0) // n)

    return jax.make_array_from_callback((mesh.devices.size * n,), NamedSharding(mesh, P(axis)), shard)


def _programs(args) -> list[tuple[str, str]]:
    """(column prefix, HETJAX_GPU_COLLECTIVES) of each variant to time."""
    both = [("hetjax", "channels"), ("hetjax_staged", "staged")]
    return {"channels": both[:1], "staged": [("hetjax", "staged")], "both": both}[args.gpu_collectives]


def islands_worker(args) -> int:
    """One island's process: hetjax's psum over every device of every island."""
    import jax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import hetjax.bridge as bridge
    import hetjax.collectives as hc
    from hetjax.cluster import parse_islands
    from hetjax.pipeline.runtime.island import join_island

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # A multi-process island is one jax.distributed cluster: joined before
    # anything touches a backend.
    join_island(parse_islands(_island_spec(args.islands)), int(os.environ["HETJAX_RANK"]))
    info = bridge.init()
    group = hc.all_islands()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    total = group.total_devices

    def program(op, path, deterministic=False):
        def body(x):
            # The path is read when the op is traced (hetjax.collectives.ops).
            os.environ["HETJAX_GPU_COLLECTIVES"] = path
            if op == "psum":
                return hc.psum(x, "d", group=group, deterministic=deterministic)[0]
            if op == "all_gather":
                return hc.all_gather(x, "d", group=group, tiled=True)[0]
            return hc.psum_scatter(x, "d", group=group, tiled=True)[0]

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))

    # (column prefix, op, program): psum as the ring and the ordered algorithm
    # (columns hetjax_ring, hetjax_ordered), the other ops under their names.
    ours = []
    for prefix, path in _programs(args):
        for op in _ops(args):
            if op == "psum":
                ours += [(f"{prefix}_{alg}", op, program(op, path, alg == "ordered")) for alg in ("ring", "ordered")]
            else:
                ours.append((f"{prefix}_{op}", op, program(op, path)))
    rows = []
    starts: dict[str, list[int]] = {}
    for size in _sizes(args):
        x = _per_device_input(mesh, "d", size, group.device_offset)
        expected = _expected(group, size)
        row = {"bytes": size}
        for name, op, fn in ours:
            _check(op, fn(x), expected, group, size)
            t = _timed(fn, x, _reps(size), starts.setdefault(f"{name} {size}", []))
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_busbw_GBps"] = _busbw(size, total, t, op)
        if info.rank == 0:
            print(json.dumps(row), flush=True)
        rows.append(row)
    if args.trace:
        _trace(args, ours, _per_device_input(mesh, "d", args.trace_kib << 10, group.device_offset), info.rank)
    Path(f"{args.part}.starts{info.rank}").write_text(json.dumps(starts))
    if info.rank == 0:
        Path(args.part).write_text(
            json.dumps({"devices": total, "island_sizes": list(group.island_sizes), "rows": rows})
        )
    bridge.shutdown()
    return 0


def _expected(group, size: int) -> dict[str, np.ndarray]:
    """What each op must give every device of the group, from every device's
    input summed in numpy: psum and all_gather the same on every device,
    psum_scatter device g's piece (`_check` picks it)."""
    inputs = [_device_input(size, g) for g in range(group.total_devices)]
    total = np.sum(inputs, axis=0, dtype=np.float32)
    return {"psum": total, "all_gather": np.concatenate(inputs), "psum_scatter": total}


def _check(op: str, y, expected: dict, group, size: int) -> None:
    """Stops the bench if a shard of `y` this process holds is not what the
    op must give its device (float32 sums of a few unit normals: another
    order differs by ulps), so a fast but wrong variant fails instead of
    reporting a bandwidth."""
    for shard in y.addressable_shards:
        start, stop, _ = shard.index[0].indices(y.shape[0])
        device = group.device_offset + start // (stop - start)
        want, got = expected[op], np.asarray(shard.data)
        if op == "psum_scatter":
            want = want.reshape(group.total_devices, -1)[device]
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            worst = np.max(np.abs(got - want)) if got.shape == want.shape else f"shape {got.shape}, not {want.shape}"
            raise SystemExit(f"{op} of {size} bytes on device {device}: wrong result (largest difference {worst})")


def _trace(args, ours, x, rank: int) -> None:
    """Profiles 5 calls of each program at --trace-kib per device into
    --trace/rank<r> (Perfetto; bench/profile_summary.py --timeline reads it)."""
    import jax

    for _, _, fn in ours:
        jax.block_until_ready(fn(x))  # compiled outside the trace
    with jax.profiler.trace(str(Path(args.trace) / f"rank{rank}"), create_perfetto_trace=True):
        for _, _, fn in ours:
            for _ in range(5):
                jax.block_until_ready(fn(x))


def reference_worker(args) -> int:
    """The reference island's process: jax.lax's psum (all_gather,
    psum_scatter) over all its devices."""
    import jax
    from jax import lax
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    mesh = Mesh(np.array(jax.devices()), ("g",))
    n = mesh.devices.size
    ops = {
        "psum": lambda x: lax.psum(x, "g"),
        "all_gather": lambda x: lax.all_gather(x, "g", tiled=True),
        "psum_scatter": lambda x: lax.psum_scatter(x, "g", tiled=True),
    }
    programs = {
        op: jax.jit(jax.shard_map(ops[op], mesh=mesh, in_specs=P("g"), out_specs=P("g"), check_vma=False))
        for op in _ops(args)
    }
    rows = []
    for size in _sizes(args):
        x = _per_device_input(mesh, "g", size, 0)
        row = {"bytes": size}
        for op, fn in programs.items():
            t = _timed(fn, x, _reps(size))
            row[f"xla_{op}_us"] = t * 1e6
            row[f"xla_{op}_busbw_GBps"] = _busbw(size, n, t, op)
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.part).write_text(json.dumps({"devices": n, "platform": jax.devices()[0].platform, "rows": rows}))
    return 0


def _ratios(row: dict) -> dict:
    """hetjax's time over XLA's, per variant of the same op (higher is better):
    ring_over_xla, ordered_over_xla, all_gather_over_xla, staged_ring_over_xla..."""
    out = {}
    for prefix in ("hetjax_", "hetjax_staged_"):
        staged = "staged_" if prefix == "hetjax_staged_" else ""
        for variant, op in (
            ("ring", "psum"),
            ("ordered", "psum"),
            ("all_gather", "all_gather"),
            ("psum_scatter", "psum_scatter"),
        ):
            ours, ref = row.get(f"{prefix}{variant}_us"), row.get(f"xla_{op}_us")
            if ours and ref:
                out[f"{staged}{variant}_over_xla"] = ref / ours
    return out


def _default_reference(islands) -> str | None:
    platforms = {i.platform for i in islands}
    if len(platforms) != 1:
        return None
    p = platforms.pop()
    total = sum(i.total_devices for i in islands)
    return f"cpu*{total}" if p == "cpu" else f"{p}:0-{total - 1}"


def _gpus() -> list[str]:
    try:
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        return []


def _bench_env(gpu_path: str) -> dict[str, str]:
    # GPU islands of one host collect over the slot channels HETJAX_GPU_PATH
    # sets up (off: none, as between hosts: staged bridge messages).
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "HETJAX_GPU_PATH": gpu_path}


_COLUMNS = [
    ("ring us", "hetjax_ring_us"),
    ("ring busbw GB/s", "hetjax_ring_busbw_GBps"),
    ("ring start skew us", "hetjax_ring_start_skew_us"),
    ("ordered us", "hetjax_ordered_us"),
    ("ordered busbw GB/s", "hetjax_ordered_busbw_GBps"),
    ("staged ring busbw GB/s", "hetjax_staged_ring_busbw_GBps"),
    ("XLA psum us", "xla_psum_us"),
    ("XLA busbw GB/s", "xla_psum_busbw_GBps"),
    ("all_gather busbw GB/s", "hetjax_all_gather_busbw_GBps"),
    ("XLA all_gather busbw GB/s", "xla_all_gather_busbw_GBps"),
    ("psum_scatter busbw GB/s", "hetjax_psum_scatter_busbw_GBps"),
    ("XLA psum_scatter busbw GB/s", "xla_psum_scatter_busbw_GBps"),
]


def table(result: dict) -> str:
    """The rows as a markdown table (docs/collectives.md)."""

    def cell(row, key):
        if key not in row:
            return "-"
        return f"{row[key]:.0f}" if key.endswith("_us") else f"{row[key]:.3f}"

    columns = [(name, key) for name, key in _COLUMNS if any(key in row for row in result["rows"])]
    lines = [
        "| bytes/device | " + " | ".join(name for name, _ in columns) + " |",
        "| --- " * (len(columns) + 1) + "|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['bytes']} | " + " | ".join(cell(row, k) for _, k in columns) + " |")
    return "\n".join(lines)


def _island_spec(islands: str) -> str:
    """--islands as the inline syntax: N means N one-device CPU islands."""
    return ",".join(["cpu"] * int(islands)) if islands.isdigit() else islands


def drive(args) -> int:
    from hetjax.cluster import parse_islands
    from hetjax.launch import ProcessSpec, island_process_specs, run_local

    islands = parse_islands(_island_spec(args.islands))
    reference = args.reference or _default_reference(islands)
    _ops(args)  # refused here, before any process starts
    if not _sizes(args):
        raise SystemExit(f"no size to time: --min-kib {args.min_kib} is above --max-mib {args.max_mib}")
    common = ["--min-kib", str(args.min_kib), "--max-mib", str(args.max_mib), "--ops", args.ops]
    if args.trace:
        common += ["--trace", str(Path(args.trace).resolve()), "--trace-kib", str(args.trace_kib)]
    with tempfile.TemporaryDirectory() as tmp:
        ours_part, ref_part = Path(tmp) / "islands.json", Path(tmp) / "reference.json"
        argv = [sys.executable, __file__, "--worker", "islands", "--part", str(ours_part), *common]
        argv += ["--gpu-collectives", args.gpu_collectives, "--islands", args.islands]
        specs = island_process_specs(islands, argv, _bench_env(args.gpu_path))
        codes = run_local(specs, timeout_s=args.timeout)
        if any(codes):
            print(f"island processes failed: exit codes {codes}", file=sys.stderr)
            return next(c for c in codes if c)
        ours = json.loads(ours_part.read_text())
        starts = [json.loads(Path(f"{ours_part}.starts{r}").read_text()) for r in range(len(specs))]
        for row in ours["rows"]:
            for key in [k for k in row if k.endswith("_us") and not k.endswith("_skew_us")]:
                name = key[: -len("_us")]
                row[f"{name}_start_skew_us"] = _start_skew_us([s[f"{name} {row['bytes']}"] for s in starts])
        ref = None
        if reference:
            (ref_island,) = parse_islands(reference)
            argv = [sys.executable, __file__, "--worker", "reference", "--part", str(ref_part), *common]
            codes = run_local(
                [ProcessSpec("reference", argv, {**ref_island.process_env(), **_bench_env(args.gpu_path)})],
                timeout_s=args.timeout,
            )
            if any(codes):
                print(f"reference process failed: exit code {codes[0]}", file=sys.stderr)
                return codes[0]
            ref = json.loads(ref_part.read_text())
    rows = ours["rows"]
    if ref:
        for row, r in zip(rows, ref["rows"]):
            row.update({k: v for k, v in r.items() if k != "bytes"})
            row.update(_ratios(row))
    import jax

    result = {
        "what": "float32 collectives (`ops`) of `bytes` of input per device over every device of "
        "every island (hetjax's hierarchical ops: XLA's collective inside each island, the "
        "bridge between islands); bus bandwidth = bytes*f/time for G devices, f = 2(G-1)/G "
        "(psum), G-1 (all_gather, tiled), (G-1)/G (psum_scatter, tiled); reference: the same "
        "jax.lax op over the reference island's devices, same run, after the islands' "
        "processes ended; *_over_xla = XLA's time / hetjax's; *_start_skew_us = median "
        "over the timed calls of how far apart the island processes started each one",
        "islands": _island_spec(args.islands),
        "ops": _ops(args),
        "island_sizes": ours["island_sizes"],
        "devices": ours["devices"],
        "reference": reference,
        "reference_devices": ref["devices"] if ref else None,
        "machine": {
            "node": platform.node(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "gpus": _gpus(),
        },
        "transport": os.environ.get("HETJAX_TRANSPORT", "auto"),
        "gpu_path": args.gpu_path,
        "gpu_collectives": args.gpu_collectives,
        "command": " ".join(["python", "bench/bench_collectives.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"wrote {args.out}")
    return replot(args.out)


def replot(result_json) -> int:
    """Draws a result's bus bandwidth against size next to it (.png)."""
    from hetjax.plots import plot_busbw

    png = plot_busbw(json.loads(Path(result_json).read_text()), Path(result_json).with_suffix(".png"))
    print(f"wrote {png}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--islands", default="2", help="islands as for `hetjax train` (cuda:0-1,cuda:2-3), or N one-device CPU islands"
    )
    parser.add_argument(
        "--reference",
        default=None,
        help="one island whose jax.lax.psum is the reference (default: all the "
        "islands' devices as one island, when they share a platform)",
    )
    parser.add_argument(
        "--ops",
        default="psum",
        help=f"comma list of {', '.join(OPS)}: which collectives to time (hetjax and XLA alike)",
    )
    parser.add_argument("--min-kib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--out", default=str(ROOT / "bench/results/collectives_cpu.json"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--gpu-collectives",
        choices=("channels", "staged", "both"),
        default="channels",
        help="GPU islands: over the GPU slot channels, staged through host memory, or both in one run",
    )
    parser.add_argument(
        "--gpu-path",
        choices=("auto", "ipc", "host", "off"),
        default="auto",
        help="HETJAX_GPU_PATH for the islands: which slot channels GPU pairs get (off: none, bridge messages)",
    )
    parser.add_argument("--trace", metavar="DIR", help="also profile 5 calls of every hetjax program into DIR/rank<r>")
    parser.add_argument("--trace-kib", type=int, default=1024, help="bytes per device of the profiled calls")
    parser.add_argument("--replot", metavar="JSON", help="only draw a saved result's plot (JSON -> .png beside it)")
    parser.add_argument("--worker", choices=("islands", "reference"), help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.replot:
        return replot(args.replot)
    if args.worker == "islands":
        return islands_worker(args)
    if args.worker == "reference":
        return reference_worker(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
