"""Training throughput of one model in three configurations, and their losses.

    python bench/bench_train.py --preset h200x2 --json bench/results/train_h200x2.json
    python bench/bench_train.py --preset h200x4 --json bench/results/train_h200x4.json
    python bench/bench_train.py --platform cpu --models tiny --steps 6 --json /tmp/train_cpu.json

For every model, the same schedule, global batch and sequence length run as
  (a) heterogeneous: two islands (one process each), the stages joined by the bridge
      (its own choice of path: device-direct between CUDA islands of one host);
  (h) the same as (a) with the bridge staging through host memory (HETJAX_GPU_PATH=host);
  (b) homogeneous: one island over the same devices, the same two stages, joined
      by XLA's own device-to-device transfers;
  (c) the single-island configuration a user would pick instead: one stage, data
      parallel over all devices (FSDP where replicated state would not fit);
  (d) data parallelism across the two islands of (a): a replica per island,
      gradients all-reduced over the bridge in buckets during the backward
      (`--parallel data`, docs/collectives.md "Overlap");
  (s) data parallelism over one island per device (`cuda:0,cuda:1,...`):
      with four, the all-reduce halves and doubles over pair kernels;
  (e) the same data-parallel job on one island of all the devices (XLA's
      collectives only): what (d) and (s) are measured against. (d) runs
      twice (e)'s microbatches and (s) (e)'s times the devices, so that
      every device computes microbatches of the same rows in each (e splits
      each microbatch over its island's devices).
(a) and (b) also get the same layer split and the same data, so their losses
must agree. Each run is `hetjax train` in a subprocess with a hard timeout; a
failed run is recorded with its log's tail and the others go on. Results are
written after every run, so a run cut short still leaves everything measured.

Figures: tokens/s (median of the steps after the first two, which compile),
model TFLOP/s per device (models.flops_per_token, the same formula for every
configuration), MFU against --peak-tflops, peak memory per device, the ratios
(a)/(b), (a)/(c) and (d)/(e), and the relative differences of (a)'s and (b)'s,
and of (d)'s and (e)'s, final losses.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GIB = 1 << 30
H200_BF16_TFLOPS = 989.0


@dataclasses.dataclass
class RunSpec:
    model: str
    config: str  # "a" | "h" | "b" | "c"
    steps: int
    seq_len: int
    batch: int
    microbatches: int
    data: str
    timeout_s: float


# ---- the three configurations -------------------------------------------------


def config_flags(config: str, platform_name: str, devices: int, layers: list[int], fsdp: bool) -> list[str]:
    """`hetjax train` flags that place the model for configuration a, h, b, c, d, s, e or r."""
    ids = f"{platform_name}:0-{devices - 1}" if platform_name != "cpu" else f"cpu*{devices}"
    half = devices // 2
    if platform_name == "cpu":
        two_islands = ",".join([f"cpu*{half}"] * 2) if half > 1 else "cpu,cpu"
    else:
        two_islands = (
            f"{platform_name}:0-{half - 1},{platform_name}:{half}-{devices - 1}"
            if half > 1
            else f"{platform_name}:0,{platform_name}:1"
        )
    if config in ("a", "h"):
        return ["--islands", two_islands, "--plan", ",".join(map(str, layers)), "--memory-gb", "100000,100000"]
    if config == "d":
        if platform_name != "cpu" and half > 1:
            # A process per GPU: GPU collectives ride the slot channels only
            # between one-GPU processes (docs/collectives.md).
            two_islands = f"{platform_name}:0-{half - 1}/{half},{platform_name}:{half}-{devices - 1}/{half}"
        return ["--parallel", "data", "--islands", two_islands, "--memory-gb", "100000,100000"]
    if config == "e":
        return ["--parallel", "data", "--islands", ids, "--memory-gb", "100000"]
    singles = ",".join(f"{platform_name}:{k}" if platform_name != "cpu" else "cpu" for k in range(devices))
    if config == "s":
        return ["--parallel", "data", "--islands", singles, "--memory-gb", ",".join(["100000"] * devices)]
    if config == "r":
        plan, memory = ",".join(map(str, layers)), ",".join(["100000"] * devices)
        return ["--islands", singles, "--replicas", str(half), "--plan", plan, "--memory-gb", memory]
    if config == "b":
        return ["--islands", ids, "--stages", "2", "--plan", ",".join(map(str, layers)), "--memory-gb", "100000"]
    if config == "c":
        return ["--islands", ids, "--stages", "1", "--plan", str(sum(layers)), "--memory-gb", "100000"] + (
            ["--fsdp"] if fsdp else []
        )
    raise ValueError(f"configuration: expected a, h, b, c, d, s, e or r, got {config!r}")


def two_stage_split(model: str, seq_len: int, batch: int, microbatches: int, platform_name: str) -> list[int]:
    """The planner's split of the model over two equal devices (used by a and b alike)."""
    from hetjax.cluster import parse_islands
    from hetjax.pipeline.plan.planner import Workload, plan
    from hetjax.zoo import models

    spec = "cpu,cpu" if platform_name == "cpu" else f"{platform_name}:0,{platform_name}:1"
    islands = [dataclasses.replace(i, memory_gb=100000.0) for i in parse_islands(spec)]
    work = Workload(seq_len=seq_len, batch=batch, microbatches=microbatches, schedule="1f1b", dtype="bfloat16")
    return plan(models.get_config(model), islands, work).layers_per_stage


# ---- one run ------------------------------------------------------------------


def run_one(spec: RunSpec, flags: list[str], out: pathlib.Path, extra: list[str]) -> dict:
    run_dir = out / f"{spec.model}-{spec.config}"
    cmd = [
        sys.executable,
        "-m",
        "hetjax.cli",
        "train",
        spec.model,
        *flags,
        "--schedule",
        "1f1b",
        "--dtype",
        "bfloat16",
        "--data",
        spec.data,
        "--steps",
        str(spec.steps),
        "--seq-len",
        str(spec.seq_len),
        "--batch",
        str(spec.batch),
        "--microbatches",
        str(spec.microbatches),
        "--out",
        str(run_dir),
        "--no-progress",
        "--timeout",
        str(spec.timeout_s),
        *extra,
    ]
    record = {**dataclasses.asdict(spec), "command": " ".join(cmd[1:])}
    start = time.perf_counter()
    try:
        env = {**os.environ, "HETJAX_GPU_PATH": "host"} if spec.config == "h" else None
        proc = subprocess.run(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=spec.timeout_s + 30,
            env=env,
        )
        record["returncode"], log = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        record["returncode"], log = (
            "timeout",
            (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""),
        )
    record["wall_s"] = round(time.perf_counter() - start, 1)
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / f"{spec.model}-{spec.config}.log").write_text(log)
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    record["per_step"] = {k: [r[k] for r in rows] for k in ("loss", "tokens_per_s", "step_time_s", "grad_norm")}
    record["peak_memory_gib"] = _peak_memory(run_dir)
    if record["returncode"] != 0:
        record["log_tail"] = log[-3000:]
    return record


def _peak_memory(run_dir: pathlib.Path) -> dict:
    """{"rank<r>:<device>": GiB}: every process names its first GPU cuda:0."""
    peaks = {}
    for f in sorted(run_dir.glob("memory-*.json")):
        rank = f.stem.split("-", 1)[1]
        for device, value in json.loads(f.read_text()).items():
            peaks[f"rank{rank}:{device}"] = None if value is None else round(value / GIB, 2)
    return peaks


def figures(record: dict, flops_per_token: float, devices: int, peak_tflops: float) -> dict:
    """Steady-state throughput of a run (steps after the first two)."""
    tps = record["per_step"]["tokens_per_s"]
    if not tps:
        return {}
    steady = tps[2:] if len(tps) > 3 else tps[-1:]
    tokens_per_s = statistics.median(steady)
    tflops = flops_per_token * tokens_per_s / devices / 1e12
    losses = record["per_step"]["loss"]
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "tflops_per_device": tflops,
        "mfu": tflops / peak_tflops,
        "step_time_s": round(
            statistics.median(record["per_step"]["step_time_s"][2:] or record["per_step"]["step_time_s"]), 4
        ),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def compare(runs: dict[str, dict]) -> dict:
    """(a)/(b), (a)/(c) throughput and the relative final-loss difference of a
    and b; the same for the host-staged bridge (h) where it ran; (d)/(e) and
    the loss difference of d and e, data parallelism across islands against
    one island."""
    out = {}
    b, c = (runs.get(k, {}).get("tokens_per_s") for k in "bc")
    lb = runs.get("b", {}).get("per_step", {}).get("loss")
    for het in "ah":
        tokens = runs.get(het, {}).get("tokens_per_s")
        if tokens and b:
            out[f"{het}_over_b"] = round(tokens / b, 4)
        if tokens and c:
            out[f"{het}_over_c"] = round(tokens / c, 4)
        losses = runs.get(het, {}).get("per_step", {}).get("loss")
        if losses and lb and len(losses) == len(lb):
            prefix = "" if het == "a" else f"{het}_"
            out[f"{prefix}final_loss_rel_diff"] = abs(losses[-1] - lb[-1]) / abs(lb[-1])
            out[f"{prefix}max_loss_rel_diff"] = max(abs(x - y) / abs(y) for x, y in zip(losses, lb))
    e = runs.get("e", {})
    le = e.get("per_step", {}).get("loss")
    for across in "dsr":
        run = runs.get(across, {})
        if run.get("tokens_per_s") and e.get("tokens_per_s"):
            out[f"{across}_over_e"] = round(run["tokens_per_s"] / e["tokens_per_s"], 4)
        losses = run.get("per_step", {}).get("loss")
        if losses and le and len(losses) == len(le):
            out[f"{across}_final_loss_rel_diff"] = abs(losses[-1] - le[-1]) / abs(le[-1])
            out[f"{across}_max_loss_rel_diff"] = max(abs(x - y) / abs(y) for x, y in zip(losses, le))
    return out


# ---- presets and the driver -----------------------------------------------------

# H200 x2: the papers' models for throughput, the 1B model for the 100-step loss
# comparison; ordered so that what matters most is measured first.
H200X2 = [
    # model, configs, steps, seq_len, batch, microbatches (a, b), data
    ("llama3.2-1b", "ab", 100, 2048, 8, 8, "builtin"),
    ("llama3-8b", "abc", 5, 4096, 16, 16, "synthetic"),
    ("qwen2-7b", "abc", 5, 4096, 16, 16, "synthetic"),
    ("llama3.2-1b", "c", 100, 2048, 8, 8, "builtin"),
    # data parallelism across the islands cuda:0,cuda:1 against one island cuda:0-1
    ("llama3.2-1b", "de", 100, 2048, 16, 8, "builtin"),
]


# H200 x4: two islands of two GPUs (cuda:0-1,cuda:2-3), one stage each, data
# parallel inside, against one island cuda:0-3 with the same two stages. Two
# rows per microbatch, one per GPU of a stage: the per-GPU work of the x2 run.
H200X4 = [
    ("llama3-8b", "ab", 5, 4096, 32, 16, "synthetic"),
]

PRESETS = {"h200x2": (H200X2, 2), "h200x4": (H200X4, 4)}


def machine_info() -> dict:
    info = {"host_python": platform.python_version()}
    try:
        import jax

        info["jax"] = jax.__version__
    except ImportError:
        pass
    try:
        gpus = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
        info["gpus"] = gpus
    except (OSError, subprocess.TimeoutExpired):
        info["gpus"] = []
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="h200x2: the headline suite on two H200s; h200x4: llama3-8b over two "
        "islands of two H200s vs one island of four (sets --devices 4)",
    )
    p.add_argument("--platform", default="cuda", help="cuda | rocm | cpu")
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="devices in total, split in two islands for config a (default: the preset's, else 2)",
    )
    p.add_argument("--models", default="llama3.2-1b", help="comma list (without --preset)")
    p.add_argument("--configs", default="abc")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=8, help="for a and b; c uses one row per device")
    p.add_argument("--data", default="synthetic")
    p.add_argument(
        "--fsdp",
        default="auto",
        choices=("auto", "yes", "no"),
        help="config c: shard state over the devices (auto: when replicated state would not fit in --memory-gb)",
    )
    p.add_argument("--memory-gb", type=float, default=140.0, help="per device, for --fsdp auto")
    p.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    p.add_argument("--run-timeout", type=float, default=240.0, help="seconds per run")
    p.add_argument("--deadline", type=float, default=None, help="start no run after this many seconds")
    p.add_argument("--remat", default=None, help="passed to hetjax train")
    p.add_argument(
        "--layer-loop",
        default="auto",
        choices=("auto", "scan", "unrolled"),
        help="passed to hetjax train (not to an FSDP (c) run, which needs the scan); "
        "auto: hetjax train's default (unrolled without --fsdp)",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=3e-4,
        help="peak learning rate (hetjax train's 3e-3 suits the tiny models; at 8B it "
        "diverges within a few steps, and a diverging loss makes the (a)/(b) loss "
        "comparison meaningless)",
    )
    p.add_argument(
        "--train-args",
        default="",
        help="more `hetjax train` arguments for every run, e.g. '--grad-buckets 0' (one string, shell-quoted)",
    )
    p.add_argument("--out", default="runs/bench_train", help="run folders and logs")
    p.add_argument("--json", required=True, help="results file (rewritten after every run)")
    args = p.parse_args(argv)

    from hetjax.zoo import models

    preset_rows, preset_devices = PRESETS.get(args.preset, (None, 2))
    if args.devices is None:
        args.devices = preset_devices
    plan_rows = (
        preset_rows
        if args.preset
        else [
            (m, args.configs, args.steps, args.seq_len, args.batch, args.microbatches, args.data)
            for m in args.models.split(",")
        ]
    )
    extra = ["--lr", str(args.lr)] + (["--remat", args.remat] if args.remat else []) + shlex.split(args.train_args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "platform": args.platform,
        "devices": args.devices,
        "peak_tflops_per_device": args.peak_tflops,
        "schedule": "1f1b",
        "dtype": "bfloat16 compute, fp32 master weights and AdamW state",
        "runs": [],
        "comparisons": {},
    }
    start = time.perf_counter()
    for model, configs, steps, seq_len, batch, micro, data in plan_rows:
        config = models.get_config(model)
        flops = models.flops_per_token(config, seq_len)
        layers = two_stage_split(model, seq_len, batch, micro, args.platform)
        fsdp = args.fsdp == "yes" or (
            args.fsdp == "auto" and 18 * models.num_params(config) / GIB > args.memory_gb * 0.6
        )
        for config_name in configs:
            if args.deadline is not None and time.perf_counter() - start > args.deadline:
                print(f"deadline: skipping {model} ({config_name})", flush=True)
                continue
            # c splits every microbatch over all devices: one row per device.
            # d runs twice e's microbatches, so that every device of either
            # computes microbatches of the same rows (e splits each of its
            # microbatches over the island's devices): the same kernels and
            # bf16 roundings, so the two differ only in their reduction.
            # s runs e's times the devices (one row per microbatch and device).
            # r runs as many as d; each of its replicas pipelines M / R of them.
            m = {"c": max(1, batch // args.devices), "d": micro * 2, "s": micro * args.devices, "r": micro * 2}.get(
                config_name, micro
            )
            spec = RunSpec(model, config_name, steps, seq_len, batch, m, data, args.run_timeout)
            flags = config_flags(config_name, args.platform, args.devices, layers, fsdp)
            if args.layer_loop != "auto" and "--fsdp" not in flags:
                flags += ["--layer-loop", args.layer_loop]
            print(f"== {model} ({config_name}): {' '.join(flags)}", flush=True)
            record = run_one(spec, flags, out, extra)
            record.update(
                layers_per_stage=layers if config_name != "c" else [sum(layers)],
                fsdp=fsdp and config_name == "c",
                flops_per_token=flops,
                **figures(record, flops, args.devices, args.peak_tflops),
            )
            result["runs"].append(record)
            mine = {r["config"]: r for r in result["runs"] if r["model"] == model}
            result["comparisons"][model] = compare(mine)
            pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
            print(summary_line(record), flush=True)
    print(table(result))
    return 0 if all(r["returncode"] == 0 for r in result["runs"]) else 1


def summary_line(r: dict) -> str:
    if r["returncode"] != 0:
        return f"   {r['model']} ({r['config']}) FAILED ({r['returncode']}): {r.get('log_tail', '')[-600:]}"
    return (
        f"   {r['model']} ({r['config']}): {r.get('tokens_per_s')} tok/s, {r.get('tflops_per_device')} "
        f"TFLOP/s/device, MFU {r.get('mfu')}, peak {r['peak_memory_gib']} GiB, wall {r['wall_s']} s"
    )


def table(result: dict) -> str:
    lines = [f"{'model':<12} cfg {'tok/s':>10} {'TFLOP/s/dev':>11} {'MFU':>6} {'peak GiB':>16} {'loss':>8}"]
    for r in result["runs"]:
        peak = "/".join(str(v) for v in r["peak_memory_gib"].values())
        lines.append(
            f"{r['model']:<12} {r['config']:>3} {r.get('tokens_per_s', 0):>10} "
            f"{r.get('tflops_per_device', 0):>11} {r.get('mfu', 0):>6} {peak:>16} "
            f"{r.get('last_loss', float('nan')):>8.4f}"
        )
    for model, c in result["comparisons"].items():
        lines.append(f"{model}: {json.dumps(c)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
