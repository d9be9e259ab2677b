#!/usr/bin/env python3
"""Can this GPU export memory as dma-buf, and which way would GPU memory
reach an RDMA NIC here (dmabuf, peer_memory, host_staging)? Builds the C++
probe (cc/device/probe/dmabuf_probe.cc) for the flavour if needed, runs it
and prints its JSON: {device, export_ok, fd, error, registration_path,
rejected}. Exit status: the probe's (0 export worked, 2 it did not).

    python bench/probe_dmabuf.py [--flavour cuda|rocm] [--rdma-device mlx5_0]
"""

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build(flavour: str) -> pathlib.Path:
    build_dir = ROOT / "build" / f"probe_{flavour}"  # no Python parts needed
    subprocess.run(
        [
            "cmake",
            "-S",
            str(ROOT),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            f"-DHETJAX_GPU={flavour}",
            "-DHETJAX_PYTHON=OFF",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", str(build_dir), "--target", "hetjax_dmabuf_probe"], check=True, stdout=subprocess.DEVNULL
    )
    return build_dir / "cc" / "device" / "hetjax_dmabuf_probe"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavour", default="cuda", choices=["cuda", "rocm"])
    parser.add_argument("--rdma-device", default="", help="RDMA device to register with (default: first active)")
    args = parser.parse_args()
    probe = build(args.flavour)
    command = [str(probe)] + ([args.rdma_device] if args.rdma_device else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = {
            "export_ok": False,
            "fd": -1,
            "error": f"probe printed no JSON (exit {done.returncode}): {done.stdout.strip()} {done.stderr.strip()}",
        }
    print(json.dumps(report))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
