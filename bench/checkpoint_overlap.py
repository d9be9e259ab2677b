"""Does saving checkpoints slow training down? `hetjax train` on the tiny
model with `--checkpoint-every K` (each K of --every) against the same run
without checkpoints, in turns.

    python bench/checkpoint_overlap.py --every 1,10 --out bench/results/checkpoint_overlap_cpu_tiny.json

The step time here is the wall time between two consecutive rows of
metrics.jsonl, taken by polling the file as the job writes it: it holds the
save that follows a step, which the rows' own step_time_s (the step's
compute alone) does not. Medians over the steps after --skip (compilation
and the first saves), per run; a run's checkpoints are counted from its
folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["tiny", "--seq-len", "16", "--batch", "4", "--microbatches", "2", "--no-progress", "--no-plot"]


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


def run_once(steps: int, save_every: int, folder: Path, poll_s: float) -> dict:
    out = folder / f"every{save_every}"
    flags = [*TRAIN, "--steps", str(steps), "--out", str(out), "--no-tensorboard"]
    if save_every:
        flags += ["--checkpoint-every", str(save_every)]
    done = threading.Event()
    arrivals: list[float] = []
    poller = threading.Thread(target=lambda: arrivals.extend(row_arrivals(out / "metrics.jsonl", done, poll_s)))
    poller.start()
    proc = subprocess.run(
        [sys.executable, "-m", "hetjax.cli", "train", *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    done.set()
    poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"hetjax train {' '.join(flags)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    checkpoints = sorted(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*")) if save_every else []
    return {
        "arrivals": arrivals,
        "compute_s": [r["step_time_s"] for r in rows],
        "checkpoints": checkpoints,
        "coalesced_line": "coalesc" in proc.stdout + proc.stderr,
    }


def summarise(run: dict, skip: int) -> dict:
    gaps = [b - a for a, b in zip(run["arrivals"], run["arrivals"][1:])][skip:]
    return {
        "wall_step_median_ms": 1e3 * statistics.median(gaps),
        "wall_step_mean_ms": 1e3 * statistics.fmean(gaps),
        "compute_step_median_ms": 1e3 * statistics.median(run["compute_s"][skip:]),
        "checkpoints_written": len(run["checkpoints"]),
        "checkpoint_steps": run["checkpoints"],
        "said_coalesced": run["coalesced_line"],
    }


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() or "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2, help="runs of each setting, in turns")
    p.add_argument("--skip", type=int, default=5, help="first step gaps left out (compilation, first saves)")
    p.add_argument("--every", default="1", help="--checkpoint-every values to time, comma-separated")
    p.add_argument("--poll-ms", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=None, help="also write the record here (JSON)")
    args = p.parse_args()
    settings = {"without saving": 0, **{f"saving every {k} steps": int(k) for k in args.every.split(",")}}
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, every in settings.items():
                folder = Path(tmp) / f"{repeat}"
                result = summarise(run_once(args.steps, every, folder, args.poll_ms / 1e3), args.skip)
                runs[name].append(result)
                print(f"{name} (run {repeat}): {json.dumps(result)}", flush=True)
    medians = {name: statistics.median(r["wall_step_median_ms"] for r in rs) for name, rs in runs.items()}
    means = {name: statistics.median(r["wall_step_mean_ms"] for r in rs) for name, rs in runs.items()}
    base = medians["without saving"]
    ratios = {name: medians[name] / base for name in settings if settings[name]}
    for name, ratio in ratios.items():
        print(
            f"{name}: {medians[name]:.1f} ms per step (median; mean {means[name]:.1f}) against "
            f"{base:.1f} ms (mean {means['without saving']:.1f}) without saving: {ratio:.3f}x"
        )
    record = {
        "bench": "checkpoint_overlap",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor() or "unknown"},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "command": "python bench/checkpoint_overlap.py " + " ".join(sys.argv[1:]),
        "train_flags": TRAIN + ["--steps", str(args.steps)],
        "checkpoint_every": settings,
        "skip": args.skip,
        "runs": runs,
        "wall_step_median_ms": medians,
        "wall_step_mean_ms": means,
        "median_over_without": ratios,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
