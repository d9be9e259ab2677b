#!/usr/bin/env python3
"""Verbs transport bandwidth against ib_write_bw, in one soft-RoCE guest run.

    python bench/bench_verbs.py            # boots the guest, writes
                                             # bench/results/verbs_guest.json

Both measure 1 MiB RDMA writes over rxe0 between two endpoints of the same
emulated guest (scripts/rdma_guest.py), one queue pair each: perftest's
ib_write_bw (two processes) and the bridge (two bridges of one process,
cc/transport/tests/verbs_bench.cc: framing, tag matching, staging copies and
credits included), alternating over a few rounds. The ratio of the medians,
bridge / ib_write_bw, is the figure that matters; absolute numbers are those
of an emulated CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "build/verbs-cpp/cc/transport/tests/transport_verbs_bench"
RESULT = REPO / "bench/results/verbs_guest.json"
MESSAGE_BYTES = 1 << 20


def gid_index(device: str, address: str = "0000:0000:0000:0000:0000:ffff:7f00:0002"):
    """Index of the RoCE v2 IPv4-mapped GID, as the bridge picks it."""
    gids = Path(f"/sys/class/infiniband/{device}/ports/1/gids")
    types = Path(f"/sys/class/infiniband/{device}/ports/1/gid_attrs/types")
    for entry in sorted(gids.iterdir(), key=lambda p: int(p.name)):
        try:
            if entry.read_text().strip() == address and "v2" in (types / entry.name).read_text():
                return int(entry.name)
        except OSError:
            continue
    raise RuntimeError(f"no RoCE v2 GID {address} on {device}")


def ib_write_bw(device: str, iterations: int) -> dict:
    """perftest's figure: BW average in MB/s (perftest's MB is 2^20 bytes)."""
    args = [
        "ib_write_bw",
        "-d",
        device,
        "-x",
        str(gid_index(device)),
        "-s",
        str(MESSAGE_BYTES),
        "-n",
        str(iterations),
        "-F",
    ]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(2)
    client = subprocess.run(args + ["127.0.0.1"], capture_output=True, text=True, timeout=240)
    server_out = server.communicate(timeout=60)[0]
    rows = re.findall(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", client.stdout, re.M)
    if client.returncode != 0 or not rows:
        raise RuntimeError(f"ib_write_bw failed:\n{client.stdout}\n{client.stderr}\n{server_out}")
    size, iters, peak, average, _ = rows[-1]
    return {"message_bytes": int(size), "iterations": int(iters), "mib_per_s": float(average)}


def bridge_bw(device: str, count: int) -> dict:
    out = subprocess.run(
        [str(BENCH), device, str(MESSAGE_BYTES), str(count)], capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise RuntimeError(f"verbs_bench failed:\n{out.stdout}\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["mib_per_s"] = round(result.pop("mb_per_s") * 1e6 / 2**20, 2)
    return result


def inside(out: Path, iterations: int, rounds: int) -> int:
    """Alternates the two measurements, so that load on the host (the guest
    is emulated on its CPUs) weighs on both alike; the ratio is of medians."""
    perftest, bridge = [], []
    for _ in range(rounds):
        perftest.append(ib_write_bw("rxe0", iterations))
        bridge.append(bridge_bw("rxe0", iterations))
    median = lambda runs: statistics.median(r["mib_per_s"] for r in runs)
    result = {
        "where": "qemu TCG guest, Debian 6.1 kernel, soft-RoCE rxe0 on a dummy netdev, 2 vCPUs (scripts/rdma_guest.py)",
        "rounds": rounds,
        "ib_write_bw": {
            **perftest[-1],
            "mib_per_s": median(perftest),
            "rounds_mib_per_s": [r["mib_per_s"] for r in perftest],
        },
        "hetjax_verbs": {
            **bridge[-1],
            "mib_per_s": median(bridge),
            "rounds_mib_per_s": [r["mib_per_s"] for r in bridge],
        },
        "ratio": round(median(bridge) / median(perftest), 3),
    }
    (out / "verbs_guest.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="alternating ib_write_bw / bridge measurements")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)  # the guest's half
    args = parser.parse_args()
    if args.inside is not None:
        return inside(args.inside, args.iterations, args.rounds)
    sys.path.insert(0, str(REPO / "scripts"))
    import rdma_guest

    if not BENCH.exists():
        raise SystemExit(
            f"{BENCH} is missing: build it with cmake -S . -B "
            f"build/verbs-cpp -DHETJAX_VERBS=ON -DHETJAX_PYTHON=OFF "
            f"-DCMAKE_BUILD_TYPE=Release "
            f"-DHETJAX_BUILD_TESTS=ON && ninja -C build/verbs-cpp "
            f"transport_verbs_bench"
        )
    out = Path(tempfile.mkdtemp(prefix="hetjax-bench-verbs-"))
    code, console = rdma_guest.run(
        f"python bench/bench_verbs.py --inside {out} --iterations {args.iterations} --rounds {args.rounds}",
        out,
        timeout_s=500,
    )
    produced = out / "verbs_guest.json"
    if code != 0 or not produced.exists():
        print(console[-3000:])
        return 1
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(produced.read_text())
    print(produced.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
