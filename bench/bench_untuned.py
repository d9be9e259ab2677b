"""The untuned `hetjax train` command over islands against one island of the same devices.

    python bench/bench_untuned.py --islands cuda:0-1,cuda:2-3 --models llama3-8b,qwen2-7b \\
        --json bench/results/train_h100x4_untuned.json --plot bench/results/train_h100x4_untuned.png
    python bench/bench_untuned.py --islands cpu*2,cpu*2 --models tiny --seq-len 64 --batch 8 --dtype float32

For every model:
  (a) `hetjax train MODEL --islands ISLANDS` and no tuning flag: the planner's own layout;
  (b) one island of the same devices running (a)'s plan: its stages, tensor-parallel
      degree, schedule and microbatches; interleaved stages run as lanes of the island
      (docs/pipeline.md), so (a) and (b) run the same programs in the same order and
      differ only in the bridge;
  (c) one island of the same devices with --fsdp and the planner's remat.

Records each run's tokens/s and model TFLOP/s per device (the median after the first
two steps), its losses, the planner's predicted step, and per lane (an island's devices,
or one lane of them) the planner's predicted peak against `peak_bytes_in_use`; and the
ratios (a)/(b) and (a)/(c) and the final-loss relative difference of (a) and (b). The
JSON is written after every run, so a call cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hetjax.cluster import parse_islands  # noqa: E402
from hetjax.pipeline.plan.planner import GIB, Plan, lane_memory_gb, stage_lane  # noqa: E402


def one_island(islands: str) -> str:
    """The one island of every device of `islands` (one platform, one host)."""
    parsed = parse_islands(islands)
    platforms = {i.platform for i in parsed}
    if len(platforms) != 1:
        raise SystemExit(f"--islands {islands}: expected one platform for the one-island runs, got {sorted(platforms)}")
    (name,) = platforms
    if name == "cpu":
        return f"cpu*{sum(i.total_devices for i in parsed)}"
    ids = sorted(d for i in parsed for d in (i.device_ids or ()))
    if ids != list(range(ids[0], ids[-1] + 1)):
        raise SystemExit(f"--islands {islands}: expected consecutive device ids, got {ids}")
    return f"{name}:{ids[0]}-{ids[-1]}"


def same_plan_flags(job: dict, one: str) -> list[str] | str:
    """(b)'s flags: `one` running the plan of (a)'s job.json, or why it cannot."""
    plan = Plan.from_dict(job["plan"])
    degrees = {s.tp for s in plan.stages}
    if len(degrees) != 1:
        return f"the islands' tensor-parallel degrees differ ({sorted(degrees)}); one island has one"
    if len({s.devices for s in plan.stages}) != 1:
        return "the stages run on different numbers of devices; one island splits its devices evenly"
    remats = {s.remat or "none" for s in plan.stages}
    return [
        "--islands",
        one,
        "--stages",
        str(len(plan.stages)),
        "--tp",
        str(degrees.pop()),
        "--schedule",
        plan.schedule,
        "--plan",
        ",".join(str(n) for n in plan.layers_per_stage),
        "--microbatches",
        str(plan.microbatches),
        # Per-stage choices come back from the planner's own remat: each lane
        # of (b) holds what an island of (a) holds.
        "--remat",
        remats.pop() if len(remats) == 1 else "auto",
    ]


def lane_memory(run_dir: pathlib.Path) -> list[dict]:
    """Per lane of the run's plan: the planner's predicted peak per device
    and the most any device of the lane's stages held."""
    plan = Plan.from_dict(json.loads((run_dir / "job.json").read_text())["plan"])
    peaks: dict[int, int] = {}
    for path in run_dir.glob("stage-memory-*.json"):
        for index, stage in json.loads(path.read_text())["stages"].items():
            lane = stage_lane(plan.stages[int(index)], plan.schedule)
            if stage.get("peak_bytes_in_use") is not None:
                peaks[lane] = max(peaks.get(lane, 0), stage["peak_bytes_in_use"])
    rows = []
    for lane in sorted({stage_lane(s, plan.schedule) for s in plan.stages}):
        predicted = lane_memory_gb(plan.stages, lane, plan.schedule, plan.microbatches)
        measured = peaks[lane] / GIB if lane in peaks else None
        rows.append(
            {
                "lane": lane,
                "stages": [s.index for s in plan.stages if stage_lane(s, plan.schedule) == lane],
                "predicted_gib": round(predicted, 2),
                "measured_gib": None if measured is None else round(measured, 2),
                "error": None if measured is None or predicted <= 0 else round(measured / predicted - 1, 4),
            }
        )
    return rows


def collect(run_dir: pathlib.Path) -> dict:
    """What a finished run's folder says (empty where the run wrote nothing)."""
    out: dict = {}
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        out |= {k: summary.get(k) for k in ("tokens_per_s", "tflops_per_device", "step_time_s")}
    if (run_dir / "metrics.jsonl").exists():
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out["losses"] = [r["loss"] for r in rows]
    if (run_dir / "job.json").exists():
        job = json.loads((run_dir / "job.json").read_text())
        plan = Plan.from_dict(job["plan"])
        out["plan"] = {
            "schedule": plan.schedule,
            "microbatches": plan.microbatches,
            "predicted_step_s": round(plan.step_time_s, 4),
            "stages": [
                {"layers": s.num_layers, "island": s.island, "tp": s.tp, "remat": s.remat, "devices": s.devices}
                for s in plan.stages
            ],
        }
        out["memory"] = lane_memory(run_dir)
    return out


def ratios(runs: dict) -> dict:
    a, b, c = (runs.get(k, {}) for k in "abc")
    out = {}
    if a.get("tokens_per_s") and b.get("tokens_per_s"):
        out["(a)/(b) tokens/s"] = round(a["tokens_per_s"] / b["tokens_per_s"], 4)
    if a.get("tokens_per_s") and c.get("tokens_per_s"):
        out["(a)/(c) tokens/s"] = round(a["tokens_per_s"] / c["tokens_per_s"], 4)
    if a.get("losses") and b.get("losses"):
        out["final-loss rel. diff (a) vs (b)"] = float(f"{abs(a['losses'][-1] / b['losses'][-1] - 1):.3g}")
    return out


def train(model: str, flags: list[str], common: list[str], run_dir: pathlib.Path, timeout_s: float) -> dict:
    command = [sys.executable, "-m", "hetjax.cli", "train", model, *common, *flags, "--out", str(run_dir)]
    command += ["--no-plot", "--no-progress"]
    shown = " ".join(["hetjax", "train", model, *common, *flags])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        # What the run printed and the steps it finished: a hang and a slow run read differently.
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        metrics = run_dir / "metrics.jsonl"
        steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        return {
            "command": shown,
            "rc": None,
            "outcome": f"timed out after {timeout_s:.0f} s, {steps} steps finished",
            "steps_finished": steps,
            "log_tail": said[-3000:],
        }
    found = {"command": shown, "rc": done.returncode, **collect(run_dir)}
    if done.returncode != 0:
        found["log_tail"] = (done.stdout + done.stderr)[-2000:]
    return found


def plot(record: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(record["models"])
    fig, axes = plt.subplots(1, 1 + len(models), figsize=(5 * (1 + len(models)), 4))
    width = 0.25
    for k, label in enumerate("abc"):
        values = [record["models"][m]["runs"].get(label, {}).get("tflops_per_device") or 0 for m in models]
        axes[0].bar([i + (k - 1) * width for i in range(len(models))], values, width, label=f"({label})")
    axes[0].set_xticks(range(len(models)), models)
    axes[0].set_ylabel("model TFLOP/s per device")
    axes[0].legend()
    for ax, model in zip(axes[1:], models):
        for label, run in record["models"][model]["runs"].items():
            if run.get("losses"):
                ax.plot(run["losses"], label=f"({label})")
        ax.set_title(f"{model}: loss")
        ax.set_xlabel("step")
        ax.legend()
    fig.suptitle(record["machine"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--islands", required=True, help="(a)'s islands, e.g. cuda:0-1,cuda:2-3")
    parser.add_argument("--models", default="llama3-8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", default="3e-4")
    parser.add_argument("--runs", default="abc", help="which of (a), (b), (c) to run (b needs a)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--machine", default=None, help="the machine, as the record names it")
    parser.add_argument("--json", required=True)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args(argv)

    one = one_island(args.islands)
    common = ["--dtype", args.dtype, "--seq-len", str(args.seq_len), "--batch", str(args.batch)]
    common += ["--steps", str(args.steps), "--lr", args.lr]
    record = {
        "bench": "bench/bench_untuned.py: the untuned command over islands (a), its plan on one island (b), "
        "one island with FSDP (c)",
        "machine": args.machine or platform.node(),
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python", "bench/bench_untuned.py", *(argv if argv is not None else sys.argv[1:])]),
        "models": {},
    }
    out = pathlib.Path(args.json)
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            entry = record["models"].setdefault(model, {"runs": {}})
            flags = {"a": ["--islands", args.islands], "c": ["--islands", one, "--fsdp", "--remat", "auto"]}
            for label in args.runs:
                if label == "b":
                    a_job = pathlib.Path(tmp) / model / "a" / "job.json"
                    derived = (
                        same_plan_flags(json.loads(a_job.read_text()), one) if a_job.exists() else "(a) left no plan"
                    )
                    if isinstance(derived, str):
                        entry["runs"]["b"] = {"outcome": f"not run: {derived}"}
                        continue
                    flags["b"] = derived
                run = train(model, flags[label], common, pathlib.Path(tmp) / model / label, args.timeout)
                entry["runs"][label] = run
                entry["ratios"] = ratios(entry["runs"])
                out.write_text(json.dumps(record, indent=1) + "\n")
                print(
                    f"{model} ({label}) rc {run['rc']}: {run.get('tflops_per_device')} TFLOP/s per device, "
                    f"{run.get('tokens_per_s')} tokens/s; {entry['ratios']}",
                    flush=True,
                )
    if args.plot:
        plot(record, pathlib.Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
