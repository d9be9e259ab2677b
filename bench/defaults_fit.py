"""Do the defaults ever run out of memory? `hetjax train` with no tuning flags
for every model and layout of a machine's GPUs: each run must train, or be
refused at plan time in one line; none may run out of memory.

    python bench/defaults_fit.py 0,1 [--models llama3.2-1b,...] [--steps 2] [--out results.json] [--keep DIR]
                                     [--skip-one-gpu]

The GPU list gives the layouts: one GPU, one island per GPU, one island of
all of them, and one island per GPU with --parallel data (and, with four or
more GPUs, two islands of half of them each and --replicas 2). Prints one
line per run and writes every run's outcome, figures and plan as JSON; with
--keep, each run's folder (job.json, memory-*.json, stage-memory-*.json) and
its log stay under DIR, to compare a plan with what the devices held.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

MODELS = ("llama3.2-1b", "llama3.2-3b", "llama3-8b", "qwen2-7b")
COMMAND = ["--dtype", "bfloat16", "--seq-len", "4096", "--batch", "32", "--lr", "3e-4", "--data", "synthetic"]
OOM_EXIT_CODE = 12  # hetjax/job/oom.py


def layouts(gpus: list[int]) -> list[list[str]]:
    """The --islands (and layout flags) tried on these GPUs."""
    one_each = ",".join(f"cuda:{g}" for g in gpus)
    whole = f"cuda:{gpus[0]}-{gpus[-1]}"
    out = [["--islands", f"cuda:{gpus[0]}"]]
    if len(gpus) > 1:
        out += [["--islands", one_each], ["--islands", whole], ["--islands", one_each, "--parallel", "data"]]
    if len(gpus) >= 4:
        half = len(gpus) // 2
        pairs = f"cuda:{gpus[0]}-{gpus[half - 1]},cuda:{gpus[half]}-{gpus[-1]}"
        out += [["--islands", pairs], ["--islands", one_each, "--replicas", "2"]]
    return out


def outcome(rc: int | None, log: str) -> str:
    if rc == 0:
        return "trained"
    if rc == OOM_EXIT_CODE or "RESOURCE_EXHAUSTED" in log or "out of memory" in log.lower():
        return "out of memory"
    if rc == 2 and len([line for line in log.splitlines() if line.startswith("hetjax train:")]) == 1:
        return "refused"
    return "failed" if rc is not None else "timed out"


def run(model: str, layout: list[str], steps: int, timeout_s: float, keep: pathlib.Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "run"
        cmd = [sys.executable, "-m", "hetjax.cli", "train", model, *layout, *COMMAND, "--steps", str(steps)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [*cmd, "--out", str(out), "--no-progress", "--no-plot"],
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            rc, log = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, log = None, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        record = {
            "model": model,
            "layout": " ".join(layout),
            "rc": rc,
            "outcome": outcome(rc, log),
            "seconds": round(time.perf_counter() - start, 1),
            "says": [line for line in log.splitlines() if line.startswith("hetjax")][-3:],
        }
        if (out / "summary.json").exists():
            summary = json.loads((out / "summary.json").read_text())
            keys = ("tokens_per_s", "tflops_per_device", "step_time_s", "microbatches", "layers_per_stage")
            record["summary"] = {k: summary.get(k) for k in keys}
            job = json.loads((out / "job.json").read_text())
            record["plan"] = [
                {k: s[k] for k in ("island", "devices", "tp", "first_layer", "last_layer", "remat", "memory_gb")}
                for s in job["plan"]["stages"]
            ]
            record["measured_peak_bytes"] = {
                p.name: json.loads(p.read_text()) for p in sorted(out.glob("memory-*.json"))
            }
        if keep is not None:
            kept = keep / "_".join([model, *(part.replace(":", "").replace(",", "+") for part in layout)])
            kept.mkdir(parents=True, exist_ok=True)
            (kept / "train.log").write_text(log)
            for p in out.glob("*.json"):
                shutil.copy(p, kept / p.name)
        return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", help="the GPU ids to use, e.g. 0,1 or 0,1,2,3")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    parser.add_argument("--out", default=None, help="JSON file for the records")
    parser.add_argument("--keep", default=None, help="folder to keep each run's JSON files and log in")
    parser.add_argument(
        "--skip-one-gpu", action="store_true", help="leave out the one-GPU layout (a run over fewer GPUs covers it)"
    )
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    records = []
    for model in args.models.split(","):
        for layout in layouts(gpus)[1 if args.skip_one_gpu else 0 :]:
            record = run(model, layout, args.steps, args.timeout, pathlib.Path(args.keep) if args.keep else None)
            records.append(record)
            figures = record.get("summary", {})
            tflops = f"{figures['tflops_per_device']:.0f} TFLOP/s per GPU" if figures.get("tflops_per_device") else ""
            print(
                f"{model:12s} {record['layout']:40s} {record['outcome']:14s} {tflops} {record['says'][-1:]}", flush=True
            )
            if args.out:
                pathlib.Path(args.out).write_text(json.dumps(records, indent=2))
    bad = [r for r in records if r["outcome"] not in ("trained", "refused")]
    print(f"{len(records)} runs: {len(records) - len(bad)} trained or refused at plan time, {len(bad)} did not")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
