"""Soak test of the bridge: many messages of random sizes, dtypes and tags
between three islands (three local processes, a full mesh), with small
random delays; every byte is checked, and resident memory and shared-memory
segments must not grow between the end of the warm-up and the end.

    python bench/soak.py --messages 100000 --out bench/results/soak_cpu.json

Each ordered pair of ranks gets a plan made from the seed: message i has a
size, dtype and tag, and its bytes are a slice of a per-pair random buffer
with i in its first 8 bytes, so a lost, doubled or swapped message shows.
Receivers take each window of messages grouped by tag rather than in send
order, so messages wait in the unexpected buffer and tag matching is used.
Exit status 0 only when every byte matched and nothing grew.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

WORLD = 3
TAGS = (1, 2, 3, 5, 8, 13, 21)
DTYPES = (np.uint8, np.float32, np.int64, np.float16)
WINDOW = 8  # receive order is shuffled within windows of this many
WARMUP_FRACTION = 0.2
DELAY_PROBABILITY = 0.02
MAX_DELAY_S = 0.002
BASE_BYTES = 1 << 20  # per-pair random bytes that message payloads are cut from
# Flow control as a pipeline schedule has it: a receiver grants a credit per
# CREDIT_EVERY messages taken, a sender runs at most CREDITS_AHEAD grants
# ahead. Unbounded run-ahead would fill the 1 GiB unexpected buffer, and
# that high-water mark (kept by malloc) would hide any real growth.
CREDIT_TAG = 99
CREDIT_EVERY = 32
CREDITS_AHEAD = 4


def plan(src: int, dst: int, count: int, seed: int, max_bytes: int):
    """[(tag, dtype, elements)] of the messages src sends dst."""
    rng = random.Random(f"{seed}:{src}:{dst}")
    out = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.70:
            size = rng.randint(0, 512)
        elif kind < 0.97:
            size = rng.randint(513, 64 << 10)
        else:
            size = rng.randint(64 << 10, max_bytes)
        dtype = np.dtype(rng.choice(DTYPES))
        out.append((rng.choice(TAGS), dtype, size // dtype.itemsize))
    return out


def base_bytes(src: int, dst: int, seed: int, max_bytes: int) -> np.ndarray:
    rng = np.random.default_rng([seed, src, dst])
    return rng.integers(0, 256, max(BASE_BYTES, max_bytes) + 4096, dtype=np.uint8)


def payload(base: np.ndarray, index: int, dtype: np.dtype, elements: int) -> np.ndarray:
    nbytes = elements * dtype.itemsize
    offset = (index * 4099) % (len(base) - nbytes)
    data = base[offset : offset + nbytes].copy()
    stamp = np.frombuffer(np.uint64(index).tobytes(), np.uint8)[:nbytes]
    data[: len(stamp)] = stamp
    return data.view(dtype)


def receive_order(messages, seed: int, src: int, dst: int):
    """Indices in the order the receiver posts them: windows of WINDOW messages,
    each grouped by tag in a random tag order (so per-tag FIFO still holds)."""
    rng = random.Random(f"order:{seed}:{src}:{dst}")
    order = []
    for start in range(0, len(messages), WINDOW):
        window = list(range(start, min(start + WINDOW, len(messages))))
        tags = sorted({messages[i][0] for i in window})
        rng.shuffle(tags)
        order += [i for tag in tags for i in window if messages[i][0] == tag]
    return order


def memory() -> dict[str, int]:
    """Resident bytes from /proc/self/status: all (VmRSS) and private heap
    (RssAnon). Growth is judged on RssAnon: VmRSS also counts the shm rings'
    pages as traffic first touches them (up to 64 MiB per shm link, a one-off
    that a short run has not finished by the end of its warm-up)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {"rss": int(fields["VmRSS"].split()[0]) * 1024, "anon": int(fields["RssAnon"].split()[0]) * 1024}


def shm_entries(prefix: str | None) -> int | None:
    """Segments of this job in /dev/shm; None for a rank with no shm link (it
    does not know the job's prefix, and others' segments are not ours)."""
    if prefix is None:
        return None
    return sum(1 for n in os.listdir("/dev/shm") if n.startswith(prefix))


def maybe_sleep(rng: random.Random) -> None:
    if rng.random() < DELAY_PROBABILITY:
        time.sleep(rng.uniform(0, MAX_DELAY_S))


def worker(args) -> int:
    import hetjax.bridge as bridge
    from hetjax import _native

    info = bridge.init()
    me = info.rank
    peers = [p for p in range(WORLD) if p != me]
    per_pair = -(-args.messages // (WORLD * (WORLD - 1)))  # at least --messages in all
    shm_names = [link.outbound_shm for link in info.links.values() if link.outbound_shm]
    # Our job's segments are named /hetjax-<job nonce>-...: count only those.
    job_prefix = shm_names[0][1:].rsplit("-", 2)[0] + "-" if shm_names else None
    received = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def send_to(peer):
        messages = plan(me, peer, per_pair, args.seed, args.max_bytes)
        base = base_bytes(me, peer, args.seed, args.max_bytes)
        rng = random.Random(f"send-delay:{args.seed}:{me}:{peer}")
        credit = np.zeros((), np.uint8)
        granted = 0
        for i, (tag, dtype, elements) in enumerate(messages):
            while i >= (granted + CREDITS_AHEAD) * CREDIT_EVERY:
                _native.recv_array(peer, CREDIT_TAG, credit)
                granted += 1
            _native.send_array(peer, tag, payload(base, i, dtype, elements))
            maybe_sleep(rng)
        for _ in range(granted, len(messages) // CREDIT_EVERY):
            _native.recv_array(peer, CREDIT_TAG, credit)

    def receive_from(peer):
        messages = plan(peer, me, per_pair, args.seed, args.max_bytes)
        base = base_bytes(peer, me, args.seed, args.max_bytes)
        rng = random.Random(f"recv-delay:{args.seed}:{me}:{peer}")
        taken = 0
        for i in receive_order(messages, args.seed, peer, me):
            tag, dtype, elements = messages[i]
            out = np.empty(elements, dtype)
            _native.recv_array(peer, tag, out)
            if not np.array_equal(out.view(np.uint8), payload(base, i, dtype, elements).view(np.uint8)):
                with lock:
                    errors.append(f"message {i} from rank {peer} (tag {tag}, {dtype}[{elements}]) differs")
            with lock:
                received[0] += 1
            taken += 1
            if taken % CREDIT_EVERY == 0:
                _native.send_array(peer, CREDIT_TAG, np.zeros((), np.uint8))
            maybe_sleep(rng)

    def guarded(fn, peer):
        try:
            fn(peer)
        except Exception as e:  # reported below; the other threads go on
            with lock:
                errors.append(f"{fn.__name__}({peer}): {type(e).__name__}: {e}")

    threads = [threading.Thread(target=guarded, args=(fn, p)) for p in peers for fn in (send_to, receive_from)]
    expected = per_pair * len(peers)
    start = time.monotonic()
    for t in threads:
        t.start()
    warm = None
    while any(t.is_alive() for t in threads):
        if warm is None and received[0] >= WARMUP_FRACTION * expected:
            warm = {**memory(), "shm": shm_entries(job_prefix), "at": received[0]}
        time.sleep(0.005)
    for t in threads:
        t.join()
    duration = time.monotonic() - start
    stats = _native.stats()
    end = {**memory(), "shm": shm_entries(job_prefix)}
    warm = warm or end
    bridge.shutdown()
    report = {
        "rank": me,
        "island": info.island,
        "messages_received": received[0],
        "expected": expected,
        "messages_sent": stats["messages_sent"],
        "bytes_sent": stats["bytes_sent"],
        "bytes_received": stats["bytes_received"],
        "duration_s": round(duration, 3),
        "rss_warm": warm["rss"],
        "rss_end": end["rss"],
        "anon_warm": warm["anon"],
        "anon_end": end["anon"],
        "shm_warm": warm["shm"],
        "shm_end": end["shm"],
        "shm_prefix": job_prefix,
        "transports": sorted({link.kind for link in info.links.values()}),
        "errors": errors[:10],
    }
    print("SOAK " + json.dumps(report), flush=True)
    return 0 if not errors else 1


def run(args) -> dict:
    from hetjax.launch import ProcessSpec, run_local

    argv = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--messages",
        str(args.messages),
        "--seed",
        str(args.seed),
        "--max-bytes",
        str(args.max_bytes),
    ]
    env = {"JAX_PLATFORMS": "cpu", "HETJAX_TIMEOUT": str(args.timeout)}
    # A mixed mesh by default: ranks in --tcp-ranks insist on tcp (4 parallel
    # streams), the other pair agrees on shm rings.
    specs = [
        ProcessSpec(
            f"island{r}",
            argv,
            {**env, "HETJAX_ISLAND": f"island{r}", "HETJAX_TRANSPORT": "tcp" if r in args.tcp_ranks else "auto"},
        )
        for r in range(WORLD)
    ]
    output = io.StringIO()
    started = time.monotonic()
    codes = run_local(specs, timeout_s=args.timeout, output=output)
    wall = time.monotonic() - started
    reports = [json.loads(line.split("SOAK ", 1)[1]) for line in output.getvalue().splitlines() if "SOAK " in line]
    if codes != [0] * WORLD or len(reports) != WORLD:
        sys.stderr.write(output.getvalue()[-6000:])
    # Every rank has stopped: none of the job's segments may be left.
    prefixes = {r["shm_prefix"] for r in reports if r["shm_prefix"]}
    left = sum(shm_entries(p) for p in prefixes)
    return {
        "shm_left_after_stop": left,
        "codes": codes,
        "wall_s": round(wall, 2),
        "ranks": sorted(reports, key=lambda r: r["rank"]),
    }


def verdict(result: dict, rss_tolerance: int) -> list[str]:
    """Every reason the soak failed; empty when it passed."""
    problems = [] if result["codes"] == [0] * WORLD else [f"exit codes {result['codes']}"]
    for r in result["ranks"]:
        who = f"rank {r['rank']}"
        problems += [f"{who}: {e}" for e in r["errors"]]
        if r["messages_received"] != r["expected"]:
            problems.append(f"{who}: received {r['messages_received']} of {r['expected']} messages")
        if r["anon_end"] - r["anon_warm"] > rss_tolerance:
            problems.append(
                f"{who}: resident heap (RssAnon) grew {r['anon_warm']} -> {r['anon_end']} bytes "
                f"(tolerance {rss_tolerance})"
            )
        if r["shm_end"] is not None and r["shm_end"] > r["shm_warm"]:
            problems.append(f"{who}: shm segments grew {r['shm_warm']} -> {r['shm_end']}")
    if result["shm_left_after_stop"]:
        problems.append(f"{result['shm_left_after_stop']} shm segments of the job left after every rank stopped")
    if len(result["ranks"]) != WORLD:
        problems.append(f"{len(result['ranks'])} of {WORLD} ranks reported")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="total over all six directed pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-bytes", type=int, default=4 << 20, help="largest message")
    parser.add_argument("--timeout", type=float, default=900, help="hard limit for the whole run, seconds")
    parser.add_argument(
        "--rss-tolerance",
        type=int,
        default=32 << 20,
        help="allowed growth of a rank's resident heap (RssAnon) after warm-up, bytes",
    )
    parser.add_argument(
        "--tcp-ranks",
        type=lambda s: {int(r) for r in s.split(",") if r},
        default={2},
        help="ranks whose links use tcp (comma list; default 2: links 0-2 and 1-2 tcp, 0-1 shm)",
    )
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    result = run(args)
    ranks = result["ranks"]
    summary = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"{platform.system()} {platform.release()}",
        "command": "python " + " ".join([os.path.relpath(__file__)] + (argv if argv is not None else sys.argv[1:])),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "messages": sum(r["messages_received"] for r in ranks),
        "bytes": sum(r["bytes_received"] for r in ranks),
        "duration_s": max((r["duration_s"] for r in ranks), default=None),
        "wall_s": result["wall_s"],
        "rss_start": [r["rss_warm"] for r in ranks],
        "rss_end": [r["rss_end"] for r in ranks],
        "rss_anon_start": [r["anon_warm"] for r in ranks],
        "rss_anon_end": [r["anon_end"] for r in ranks],
        "shm_segments_start": [r["shm_warm"] for r in ranks],
        "shm_segments_end": [r["shm_end"] for r in ranks],
        "shm_segments_left_after_stop": result["shm_left_after_stop"],
        "transports": sorted({t for r in ranks for t in r["transports"]}),
        "rss_tolerance": args.rss_tolerance,
        "problems": verdict(result, args.rss_tolerance),
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if not summary["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
