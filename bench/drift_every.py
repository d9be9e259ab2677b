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
import json
import statistics
import sys
import tempfile
from pathlib import Path

from timed_train import in_turns, record_head, timed_train, write_record

TRAIN = ["tiny", "--islands", "cpu,cpu", "--no-progress", "--no-plot", "--no-tensorboard"]


def run_once(steps: int, every: int, out: Path, poll_s: float) -> dict:
    flags = [*TRAIN, "--steps", str(steps)]
    if every:
        flags += ["--drift-every", str(every)]
    proc, arrivals, wall_s = timed_train(flags, out, poll_s)
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
    with tempfile.TemporaryDirectory() as tmp:
        runs = in_turns(
            settings,
            args.repeats,
            lambda name, every, repeat: summarise(
                run_once(args.steps, every, Path(tmp) / f"{repeat}-{every}", args.poll_ms / 1e3), args.skip
            ),
        )
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
        **record_head("drift_every"),
        "train_flags": TRAIN + ["--steps", str(args.steps)],
        "drift_every": args.every,
        "skip": args.skip,
        "runs": runs,
        "figures": figures,
    }
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
