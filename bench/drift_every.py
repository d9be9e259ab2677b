"""What does `hetjax train --drift-every K` cost? The tiny model on two CPU
islands with the drift checks against the same run without them, in turns.

    python bench/drift_every.py --repeats 4 --out bench/results/drift_every_cpu_tiny.json

Per run: the median and the mean of the rows' step_time_s (the step's own
work, which on a checked step holds the copies of its first microbatch and
the dispatch of its rerun), and of the wall time between consecutive rows
of metrics.jsonl, polled as the job writes them (it also holds what the
background checks take from the steps beside them), both over the steps
after --skip (compilation); the whole command's wall time; and the checks'
own seconds from the drift rows; within a run, the checked steps' mean
against the median of the others.
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

from checkpoint_overlap import git_commit, row_arrivals

TRAIN = ["tiny", "--islands", "cpu,cpu", "--no-progress", "--no-plot", "--no-tensorboard"]


def run_once(steps: int, every: int, out: Path, poll_s: float) -> dict:
    flags = [*TRAIN, "--steps", str(steps), "--out", str(out)]
    if every:
        flags += ["--drift-every", str(every)]
    done = threading.Event()
    arrivals: list[float] = []
    poller = threading.Thread(target=lambda: arrivals.extend(row_arrivals(out / "metrics.jsonl", done, poll_s)))
    poller.start()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hetjax.cli", "train", *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    wall_s = time.monotonic() - started
    done.set()
    poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"hetjax train {' '.join(flags)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    checks = [json.loads(line) for p in sorted(out.glob("drift-*.jsonl")) for line in p.read_text().splitlines()]
    return {"arrivals": arrivals, "rows": rows, "checks": checks, "wall_s": wall_s, "output": proc.stdout}


def summarise(run: dict, skip: int) -> dict:
    gaps = [b - a for a, b in zip(run["arrivals"], run["arrivals"][1:])][skip:]
    compute = [r["step_time_s"] for r in run["rows"]][skip:]
    checked = sorted({c["step"] for c in run["checks"]})
    on_checked = [r["step_time_s"] for r in run["rows"][skip:] if r["step"] in checked]
    others = [r["step_time_s"] for r in run["rows"][skip:] if r["step"] not in checked]
    return {
        # Within the run: the checked steps against the others (less open to the machine's load).
        "checked_step_mean_ms": 1e3 * statistics.fmean(on_checked) if on_checked else None,
        "other_step_median_ms": 1e3 * statistics.median(others),
        "step_median_ms": 1e3 * statistics.median(compute),
        "step_mean_ms": 1e3 * statistics.fmean(compute),
        "wall_step_median_ms": 1e3 * statistics.median(gaps),
        "wall_step_mean_ms": 1e3 * statistics.fmean(gaps),
        "command_wall_s": run["wall_s"],
        "checked_steps": checked,
        "checks": len(run["checks"]),
        "check_seconds": [round(c["seconds"], 4) for c in run["checks"]],
        "largest_ratio": max((c["ratio"] for c in run["checks"]), default=None),
        "warned": "drift at stage" in run["output"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3, help="runs of each setting, in turns")
    p.add_argument("--skip", type=int, default=5, help="first steps left out (compilation)")
    p.add_argument("--poll-ms", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=None, help="also write the record here (JSON)")
    args = p.parse_args()
    settings = {"without": 0, f"drift every {args.every}": args.every}
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, every in settings.items():
                out = Path(tmp) / f"{repeat}-{every}"
                result = summarise(run_once(args.steps, every, out, args.poll_ms / 1e3), args.skip)
                runs[name].append(result)
                print(f"{name} (run {repeat}): {json.dumps(result)}", flush=True)
    figures = {}
    for field in ("step_median_ms", "step_mean_ms", "wall_step_median_ms", "wall_step_mean_ms", "command_wall_s"):
        values = {name: [r[field] for r in rs] for name, rs in runs.items()}
        medians = {name: statistics.median(v) for name, v in values.items()}
        figures[field] = {
            "median_of_runs": medians,
            "spread": {name: [min(v), max(v)] for name, v in values.items()},
            "drift_over_without": medians[f"drift every {args.every}"] / medians["without"],
        }
        print(f"{field}: {json.dumps(figures[field])}")
    record = {
        "bench": "drift_every",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor() or "unknown"},
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "command": "python bench/drift_every.py " + " ".join(sys.argv[1:]),
        "train_flags": TRAIN + ["--steps", str(args.steps)],
        "drift_every": args.every,
        "skip": args.skip,
        "runs": runs,
        "figures": figures,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
