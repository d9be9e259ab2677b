"""The rows of `hetjax train --drift-every` (drift_check.py), as the parent
reads them: each worker appends one row per checked stage and step to
<out>/drift-<rank>.jsonl; the parent follows the files for TensorBoard
(`drift/stage<k>/<quantity>`, scalar_log.py) and, once the workers have
finished, writes each checked step's rows into its metrics.jsonl row as
{"drift": {"stage<k>": {...}}}.
"""

from __future__ import annotations

import json
import pathlib

from hetjax.job.metrics_tail import MetricsTail

# The fields of a row that become TensorBoard scalars, drift/stage<k>/<field>.
SCALAR_FIELDS = ("activation", "gradient", "input_gradient", "ratio")
_NOT_IN_METRICS = ("step", "stage")


def rows_path(out, rank: int) -> pathlib.Path:
    return pathlib.Path(out) / f"drift-{rank}.jsonl"


def due(step: int, every: int | None) -> bool:
    """Whether step `step` (from 0) is checked: every `every`-th, (step + 1) % every == 0."""
    return bool(every) and (step + 1) % every == 0


def read_rows(out) -> list[dict]:
    rows = []
    for path in sorted(pathlib.Path(out).glob("drift-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def remove_rows(out, from_step: int = 0) -> None:
    """Drops the rows of the steps from `from_step` on (all of them for a
    new run): a resumed run checks those steps again."""
    for path in pathlib.Path(out).glob("drift-*.jsonl"):
        kept = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [line for line in kept if json.loads(line)["step"] < from_step]
        if kept:
            path.write_text("".join(line + "\n" for line in kept))
        else:
            path.unlink()


def merge_into_metrics(out) -> int:
    """Adds each checked step's rows to its metrics.jsonl row; how many steps were checked."""
    by_step: dict[int, dict] = {}
    for row in read_rows(out):
        entry = {k: v for k, v in row.items() if k not in _NOT_IN_METRICS}
        by_step.setdefault(row["step"], {})[f"stage{row['stage']}"] = entry
    if not by_step:
        return 0
    metrics = pathlib.Path(out) / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["step"] in by_step:
            row["drift"] = dict(sorted(by_step[row["step"]].items()))
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(by_step)


class DriftTails:
    """The rows the workers add as they come, for the scalar log."""

    def __init__(self, out, ranks: int):
        self.tails = [MetricsTail(rows_path(out, rank)) for rank in range(ranks)]

    def scalars(self):
        """(tag, value, step) of every row added since the last call."""
        for tail in self.tails:
            for row in tail.new_rows():
                for field in SCALAR_FIELDS:
                    if row.get(field) is not None:
                        yield f"drift/stage{row['stage']}/{field}", float(row[field]), int(row["step"])


def describe(out, steps_checked: int, factor: float) -> str:
    """The run's one line on its checks."""
    rows = read_rows(out)
    if not rows:
        return "drift: no step was checked"
    worst = max(rows, key=lambda r: r["ratio"])
    where = f"{worst['ratio']:.3g} x, stage {worst['stage']}'s {worst['worst']} in step {worst['step']}"
    flagged = sorted({r["stage"] for r in rows if r["ratio"] > factor})
    seconds = sum(r["seconds"] for r in rows) / len(rows)
    if not flagged:
        verdict = f"every stage within {factor:g} x its rounding noise (largest {where})"
    else:
        verdict = f"stages {flagged} beyond {factor:g} x their rounding noise (largest {where})"
    return (
        f"drift checked in {steps_checked} steps: {verdict}; {seconds:.2f} s per stage check, "
        "beside the steps (drift-<rank>.jsonl, metrics.jsonl)"
    )
