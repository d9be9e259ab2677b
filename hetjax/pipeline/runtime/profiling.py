"""One step under the JAX profiler, and where its device time went.

`hetjax train --profile-step N` traces step N in every worker process into
<run>/profile/rank<R>/ (TensorBoard/XProf and Perfetto files). `summarize`
reads the Perfetto trace and sorts device time into what limits MFU:
matmuls, attention, other fused kernels, hetjax's flag waits and copies,
NCCL, and idle time (bubbles, waiting on the host or the peer).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import pathlib
import re

# Checked in order; the first pattern found in a kernel's name wins.
CATEGORIES = (
    ("hetjax wait/signal", ("WaitFlagKernel", "SignalFlagKernel")),
    ("attention", ("fmha", "flash", "cudnn", "sdpa", "attention")),
    ("nccl", ("nccl",)),
    ("copy", ("memcpy", "memset", "MemcpyDtoH", "MemcpyHtoD", "MemcpyDtoD")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "dot", "matmul")),
)


@contextlib.contextmanager
def maybe_trace(step: int, profile_step: int | None, out: str | pathlib.Path, rank: int):
    """Traces this step if it is the one asked for; otherwise does nothing."""
    if profile_step is None or step != profile_step:
        yield
        return
    import jax

    path = pathlib.Path(out) / "profile" / f"rank{rank}"
    with jax.profiler.trace(str(path), create_perfetto_trace=True):
        yield
    print(f"profile of step {step} written to {path}", flush=True)


def categorize(name: str) -> str:
    lowered = name.lower()
    for category, patterns in CATEGORIES:
        if any(p.lower() in lowered for p in patterns):
            return category
    return "other kernels"


def kernel_kind(name: str) -> str:
    """A kernel's name without XLA's numbering (`loop_add_fusion_17` ->
    `loop_add_fusion`): an unrolled program gives every layer's copy of a
    fusion its own number, and only their sum says what costs time."""
    return re.sub(r"([._]\d+)+$", "", name)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        busy += stop - max(start, end)
        end = stop
    return busy


def _load(trace_dir: str | pathlib.Path) -> tuple[list[dict], dict, dict]:
    """The trace's events, its process names {pid: name} and thread names
    {(pid, tid): name}."""
    files = sorted(pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz"))
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    events = json.load(gzip.open(files[-1]))["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in meta if e.get("name") == "thread_name"}
    return events, processes, threads


def _origin(event) -> str:
    """ "module/op (kernel)" for a device event XLA attributed to an HLO op:
    which program and op a kernel such as memcpy128 came from."""
    args = event.get("args") or {}
    op = args.get("hlo_op") or args.get("tf_op") or ""
    if not op:
        return ""
    module = args.get("hlo_module", "")
    return f"{module}/{op} ({event.get('name', '')[:40]})"


def timeline(trace_dir: str | pathlib.Path, pattern: str = "", limit: int = 200) -> list[dict]:
    """Every complete event whose name matches `pattern` (a regex), host and
    device alike, in time order: [{t_us, dur_us, where, name, origin}] with
    t_us from the first such event and origin the XLA program/op behind a
    device event (or ""). For following one message through a step."""
    events, names, threads = _load(trace_dir)
    wanted = re.compile(pattern)
    rows = sorted(
        (e for e in events if e.get("ph") == "X" and "dur" in e and wanted.search(e.get("name", ""))),
        key=lambda e: e["ts"],
    )[:limit]
    if not rows:
        return []
    t0 = rows[0]["ts"]
    return [
        {
            "t_us": round(e["ts"] - t0, 1),
            "dur_us": round(e["dur"], 1),
            "where": f"{names.get(e['pid'], e['pid'])}/{threads.get((e['pid'], e.get('tid')), e.get('tid'))}",
            "name": e.get("name", "")[:80],
            "origin": _origin(e),
        }
        for e in rows
    ]


def summarize(trace_dir: str | pathlib.Path) -> dict:
    """{device: {window_us, busy_us, idle_fraction, categories, kinds, ops}}:
    device time (us) per category, per kernel kind (`kernel_kind`, top 12)
    and per launching XLA op (`_origin`, top 12).

    Devices are the trace's processes named /device:...; where the trace has
    none (CPU platform), the XLA CPU client's threads stand in for one."""
    events, names, threads = _load(trace_dir)
    device_pids = {pid for pid, name in names.items() if name.startswith("/device:")}

    def device_of(event) -> str | None:
        pid = event.get("pid")
        if device_pids:
            return names[pid] if pid in device_pids else None
        thread = threads.get((pid, event.get("tid")), "")
        return "/host:CPU (XLA client)" if "XLA" in thread or "Cpu" in thread else None

    per_device: dict[str, dict] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        device = device_of(e)
        if device is None:
            continue
        entry = per_device.setdefault(device, {"categories": {}, "kinds": {}, "ops": {}})
        category = categorize(e.get("name", ""))
        entry["categories"][category] = entry["categories"].get(category, 0.0) + e["dur"]
        kind = kernel_kind(e.get("name", ""))
        entry["kinds"][kind] = entry["kinds"].get(kind, 0.0) + e["dur"]
        op = _origin(e)
        if op:
            entry["ops"][op] = entry["ops"].get(op, 0.0) + e["dur"]
        spans.setdefault(device, []).append((e["ts"], e["ts"] + e["dur"]))
    for device, entry in per_device.items():
        intervals = spans[device]
        window = max(b for _, b in intervals) - min(a for a, _ in intervals)
        busy = _union_us(intervals)
        entry["window_us"] = window
        entry["busy_us"] = busy
        entry["idle_fraction"] = 1 - busy / window if window > 0 else 0.0
        entry["kinds"] = dict(sorted(entry["kinds"].items(), key=lambda kv: -kv[1])[:12])
        entry["ops"] = dict(sorted(entry["ops"].items(), key=lambda kv: -kv[1])[:12])
    return per_device
