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
import json
import statistics
import sys
import tempfile
from pathlib import Path

from timed_train import in_turns, record_head, timed_train, write_record

TRAIN = ["tiny", "--seq-len", "16", "--batch", "4", "--microbatches", "2", "--no-progress", "--no-plot"]


def run_once(steps: int, save_every: int, folder: Path, poll_s: float, islands: str) -> dict:
    out = folder / f"every{save_every}"
    flags = [*TRAIN, "--islands", islands, "--steps", str(steps), "--no-tensorboard"]
    if save_every:
        flags += ["--checkpoint-every", str(save_every)]
    proc, arrivals, _ = timed_train(flags, out, poll_s)
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=2, help="runs of each setting, in turns")
    p.add_argument("--skip", type=int, default=5, help="first step gaps left out (compilation, first saves)")
    p.add_argument("--every", default="1", help="--checkpoint-every values to time, comma-separated")
    p.add_argument("--poll-ms", type=float, default=2.0)
    p.add_argument("--islands", default="cpu,cpu", help="hetjax train's --islands")
    p.add_argument("--out", type=Path, default=None, help="also write the record here (JSON)")
    args = p.parse_args()
    settings = {"without saving": 0, **{f"saving every {k} steps": int(k) for k in args.every.split(",")}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = in_turns(
            settings,
            args.repeats,
            lambda name, every, repeat: summarise(
                run_once(args.steps, every, Path(tmp) / f"{repeat}", args.poll_ms / 1e3, args.islands), args.skip
            ),
        )
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
        **record_head("checkpoint_overlap"),
        "train_flags": TRAIN + ["--islands", args.islands, "--steps", str(args.steps)],
        "checkpoint_every": settings,
        "skip": args.skip,
        "runs": runs,
        "wall_step_median_ms": medians,
        "wall_step_mean_ms": means,
        "median_over_without": ratios,
    }
    write_record(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
