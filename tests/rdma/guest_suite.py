"""Every verbs check that needs RDMA, run inside the soft-RoCE guest in one go.

Started by tests/rdma/conftest.py through scripts/rdma_guest.py (one guest
boot per pytest session); runs with the host's Python in the chroot. Imports
nothing of hetjax but its fork server (jax takes a minute to import under
emulation, and the fork server imports it once for both ranks): it starts
the C++ verbs tests and the pair of bridge ranks, each bounded in time, and
writes what happened to <out>/summary.json for the host side.
"""

import argparse
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hetjax.forkserver import ForkServer

WORKER = Path(__file__).parent / "workers" / "verbs_pair.py"
# What both ranks import before their first check.
PRELOAD = ("jax", "jax.numpy", "numpy", "hetjax.bridge", "hetjax.bridge.rendezvous", "hetjax.errors")
CHECK = re.compile(r"^CHECK (\S+) (ok|FAIL) ?(.*)$")
# How each verbs inbound ring was registered (verbs_ring_memory_test.cc).
RING = re.compile(r"^RING_REGISTRATION (\{.*\})$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cpp(binaries: list[str], out: Path, timeout_s: float) -> dict:
    """Runs each gtest binary in turn within `timeout_s` in all."""
    start = time.monotonic()
    rc, text = 0, ""
    for binary in binaries:
        left = max(1.0, start + timeout_s - time.monotonic())
        try:
            proc = subprocess.run([binary], capture_output=True, text=True, timeout=left)
            code, got = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            code, got = 124, (e.stdout or b"").decode(errors="replace")
        rc = rc or code
        text += f"==== {binary} (exit {code})\n{got}"
    (out / "cpp.log").write_text(text)
    return {
        "rc": rc,
        "seconds": round(time.monotonic() - start, 1),
        "passed": re.findall(r"\[       OK \] (\S+)", text),
        "failed": sorted(set(re.findall(r"\[  FAILED  \] (\S+\.\S+)", text))),
        "ring_registration": [json.loads(m) for m in RING.findall(text)],
    }


def _copy(stream, log) -> None:
    for line in iter(stream.readline, b""):
        log.write(line.decode(errors="replace"))
        log.flush()


def run_pair(out: Path, timeout_s: float) -> dict:
    env = {
        **os.environ,
        "HETJAX_WORLD_SIZE": "2",
        "HETJAX_COORDINATOR": f"127.0.0.1:{free_port()}",
        "HETJAX_SECRET": secrets.token_hex(16),
        "HETJAX_TRANSPORT": "verbs",
        "HETJAX_TIMEOUT": "60",
        "JAX_PLATFORMS": "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    start = time.monotonic()
    argv = [sys.executable, str(WORKER)]
    rank_env = [{**env, "HETJAX_RANK": "0"}, {**env, "HETJAX_RANK": "1", "HETJAX_RDMA_RING": "gpu"}]
    # Rank 1 asks for GPU rings: with no GPU here they fall back to host
    # memory, and the native module says so on stderr.
    server = ForkServer.start(rank_env[0], PRELOAD, argv, timeout_s=timeout_s)
    procs, logs, copies = [], [], []
    for rank in (0, 1):
        log = open(out / f"rank{rank}.log", "w")
        logs.append(log)
        if server is None:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=rank_env[rank]))
            continue
        proc = server.spawn(argv, rank_env[rank])
        copies.append(threading.Thread(target=_copy, args=(proc.stdout, log), daemon=True))
        copies[-1].start()
        procs.append(proc)
    codes = []
    for proc in procs:
        try:
            code = proc.wait(max(1.0, start + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            os.kill(proc.pid, 9)
            proc.wait(10)
            code = 124
        codes.append(code)
    for copy in copies:
        copy.join(timeout=10)
    if server is not None:
        server.close()
    for log in logs:
        log.close()
    checks, rings = {}, {0: [], 1: []}
    for rank in (0, 1):
        for line in (out / f"rank{rank}.log").read_text().splitlines():
            if m := CHECK.match(line):
                checks.setdefault(m[1], []).append({"rank": rank, "ok": m[2] == "ok", "detail": m[3]})
            elif "inbound ring registered by" in line:
                rings[rank].append(line)
    return {"codes": codes, "seconds": round(time.monotonic() - start, 1), "checks": checks, "gpu_ring_lines": rings}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpp-test", action="append", required=True, help="a gtest binary to run (repeatable)")
    parser.add_argument("--timeout", type=float, default=150)
    args = parser.parse_args()
    start = time.monotonic()
    summary = {"cpp": run_cpp(args.cpp_test, args.out, 80), "udmabuf": os.path.exists("/dev/udmabuf")}
    summary["pair"] = run_pair(args.out, args.timeout)
    summary["seconds"] = round(time.monotonic() - start, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
