"""Where a profiled step's device time went.

    python bench/profile_summary.py runs/<run>/profile [--json out.json]

Reads every rank's Perfetto trace (from `hetjax train --profile-step N`) and
prints, per device: the step's window, busy and idle time, time per category
(matmul, attention, other kernels, copies, nccl, hetjax waits), the top
kernels and the XLA ops that launched them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from hetjax.pipeline.runtime.profiling import summarize, timeline  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile_dir")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--timeline",
        metavar="REGEX",
        default=None,
        help="instead: list matching events (host and device) in time order",
    )
    parser.add_argument("--limit", type=int, default=200)
    args = parser.parse_args(argv)
    if args.timeline is not None:
        for rank_dir in sorted(pathlib.Path(args.profile_dir).glob("rank*")):
            print(f"== {rank_dir.name}")
            for row in timeline(rank_dir, args.timeline, args.limit):
                print(
                    f"{row['t_us']:10.1f} {row['dur_us']:9.1f}  {row['where'][:40]:40s} {row['name']}"
                    + (f"  <- {row['origin']}" if row["origin"] else "")
                )
        return 0
    report = {}
    for rank_dir in sorted(pathlib.Path(args.profile_dir).glob("rank*")):
        report[rank_dir.name] = summarize(rank_dir)
    if not report:
        raise SystemExit(f"no rank*/ folders under {args.profile_dir}")
    for rank, devices in report.items():
        if not devices:
            print(f"{rank}: no device or XLA-thread events in the trace (use --timeline)")
        for device, entry in devices.items():
            print(
                f"{rank} {device}: window {entry['window_us'] / 1e3:.2f} ms, "
                f"busy {entry['busy_us'] / 1e3:.2f} ms, idle {entry['idle_fraction']:.1%}"
            )
            for category, us in sorted(entry["categories"].items(), key=lambda kv: -kv[1]):
                print(f"    {category:20s} {us / 1e3:9.2f} ms")
            print("    by kernel (XLA's numbering dropped):")
            for kind, us in entry["kinds"].items():
                print(f"      {us / 1e3:8.2f} ms  {kind[:90]}")
            if entry["ops"]:
                print("    by XLA op:")
            for op, us in entry["ops"].items():
                print(f"      {us / 1e3:8.2f} ms  {op[:110]}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
