"""`hetjax train` runs timed from outside, for the benchmarks that set a
feature against the same run without it (checkpoint_overlap.py,
drift_every.py): the wall time between metrics rows as the job writes them,
the settings run in turns, and the head every record carries."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def row_arrivals(metrics: Path, done: threading.Event, poll_s: float) -> list[float]:
    """The monotonic time at which each complete row of `metrics` appeared."""
    arrivals: list[float] = []
    while not done.is_set():
        try:
            rows = metrics.read_bytes().count(b"\n")
        except FileNotFoundError:
            rows = 0
        now = time.monotonic()
        arrivals.extend([now] * (rows - len(arrivals)))
        time.sleep(poll_s)
    return arrivals


def timed_train(flags: list[str], out: Path, poll_s: float) -> tuple[subprocess.CompletedProcess, list[float], float]:
    """Runs `hetjax train <flags>` on CPU islands into `out`: (the finished
    process, each metrics row's arrival time, the command's wall seconds);
    SystemExit with its output's tail when it fails."""
    done = threading.Event()
    arrivals: list[float] = []
    poller = threading.Thread(target=lambda: arrivals.extend(row_arrivals(out / "metrics.jsonl", done, poll_s)))
    poller.start()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hetjax.cli", "train", *flags, "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    wall_s = time.monotonic() - started
    done.set()
    poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"hetjax train {' '.join(flags)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc, arrivals, wall_s


def in_turns(settings: dict[str, int], repeats: int, run: Callable[[str, int, int], dict]) -> dict[str, list[dict]]:
    """run(name, value, repeat) for every setting, the settings in turns so
    that a machine's drifting load falls on all of them alike; each result
    printed as it comes."""
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    for repeat in range(repeats):
        for name, value in settings.items():
            result = run(name, value, repeat)
            runs[name].append(result)
            print(f"{name} (run {repeat}): {json.dumps(result)}", flush=True)
    return runs


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() or "unknown"


def record_head(bench: str) -> dict:
    """What every record says first: the bench, the machine, the date, the
    commit and the command that wrote it."""
    return {
        "bench": bench,
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor() or "unknown"},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "command": f"python bench/{bench}.py " + " ".join(sys.argv[1:]),
    }


def write_record(path: Path | None, record: dict) -> None:
    if path:
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")
