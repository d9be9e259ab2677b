"""`hetjax drift --runs A B`: runs in this process, on the CPU (reading
checkpoints needs no island), into --out: runs.json and runs.png."""

from __future__ import annotations

import os
import pathlib
import time


def run_bisect(run_a: str, run_b: str, factor: float, out: str | None, say=print) -> pathlib.Path:
    """Compares the runs' common checkpoints and prints the table and verdict; the out folder."""
    # Before jax is imported: a GPU machine keeps its devices for the runs' jobs.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from hetjax.drift.bisect import bisect_runs
    from hetjax.drift.bisect_report import PLOT_FILE, RESULT_FILE, plot_runs, table, verdict, write_json

    if not factor > 1:
        raise ValueError(f"factor: expected a number above 1, got {factor:g}")
    result = bisect_runs(run_a, run_b, factor)
    folder = pathlib.Path(out or f"runs/drift-runs-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder, result)
    plot_runs(result, folder / PLOT_FILE)
    say(table(result))
    say(verdict(result))
    say(f"wrote {folder / RESULT_FILE} and {folder / PLOT_FILE}")
    return folder
