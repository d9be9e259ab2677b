"""A live progress bar of a running job, drawn from the metrics.jsonl lines
the last stage's process writes."""

from __future__ import annotations

import json
import pathlib
import threading
import time


def follow_metrics(worker: threading.Thread, metrics: pathlib.Path, steps: int, enabled: bool) -> None:
    """Until `worker` (the thread waiting on the job's processes) ends: a bar
    of steps done, the last loss and tokens/s; only waits when not enabled."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled:
        worker.join()
        return
    columns = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
    ]
    seen = 0
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=steps, loss="-", tps="-")
        while worker.is_alive() or seen < steps:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            for line in lines[seen:]:
                m = json.loads(line)
                bar.update(task, completed=m["step"] + 1, loss=f"{m['loss']:.4f}", tps=f"{m['tokens_per_s']:.0f}")
            seen = len(lines)
            if not worker.is_alive():
                break
            time.sleep(0.2)
