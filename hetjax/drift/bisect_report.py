"""What `hetjax drift --runs A B` prints and writes: a row per checkpointed
step (its worst parameter), the verdict, runs.json and runs.png (each
layer's parameter distance per step, against its noise)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from hetjax.drift.bisect import Bisection, worst_per_part, worst_per_step
from hetjax.plots import _figure, _save

RESULT_FILE, PLOT_FILE = "runs.json", "runs.png"
# A log axis cannot show zero: equal parameters are drawn at this height.
_ZERO_AT = 1e-12


def verdict(b: Bisection) -> str:
    """Where the runs part first, or that they do not."""
    if b.first is None:
        worst = max(b.entries, key=lambda e: e.ratio)
        return (
            f"the runs agree at every common checkpoint ({len(b.steps)}, steps {b.steps[0]}..{b.steps[-1]}): "
            f"worst {worst.part} {worst.param} at step {worst.step}, {worst.ratio:.2g} x noise (flag above {b.factor:g} x)"
        )
    f = b.first
    since = (
        f"after agreeing at step {b.agreed_until}: parted in steps {b.agreed_until}..{f.step - 1} (numbered from 0)"
        if b.agreed_until is not None
        else "at the first checkpoint both runs hold"
    )
    return (
        f"the runs part first at the checkpoint of step {f.step}, {since}; "
        f"most at {f.part} {f.param}: distance {f.distance:.3g}, {f.ratio:.3g} x noise"
    )


def table(b: Bisection) -> str:
    header = ("step", "layer", "worst parameter", "distance", "noise", "x noise", "flag")
    lines = [header]
    for e in worst_per_step(b.entries):
        row = (str(e.step), e.part, e.param, f"{e.distance:.3g}", f"{e.noise:.3g}", f"{e.ratio:.3g}")
        lines.append((*row, "FLAG" if e.flagged else ""))
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)


def write_json(folder: pathlib.Path, b: Bisection) -> pathlib.Path:
    """runs.json: the runs, dtype and factor, the first parting, and every (step, parameter)."""
    result = {
        "runs": list(b.runs),
        "model": b.model,
        "dtype": b.dtype,
        "factor": b.factor,
        "steps": b.steps,
        "first_parting": dataclasses.asdict(b.first) if b.first else None,
        "agreed_until": b.agreed_until,
        "entries": [dataclasses.asdict(e) for e in b.entries],
    }
    path = folder / RESULT_FILE
    path.write_text(json.dumps(result, indent=1))
    return path


def plot_runs(b: Bisection, path: pathlib.Path) -> pathlib.Path:
    """Each part's largest parameter distance per step, its noise dashed; the first parting ringed."""
    fig, ax = _figure(1, (7.5, 4.5))
    for part, rows in worst_per_part(b.entries).items():
        steps = [e.step for e in rows]
        (line,) = ax.plot(steps, [max(e.distance, _ZERO_AT) for e in rows], marker="o", markersize=3, label=part)
        ax.plot(steps, [max(e.noise, _ZERO_AT) for e in rows], linestyle="--", color=line.get_color(), alpha=0.4)
    if b.first:
        ax.scatter([b.first.step], [max(b.first.distance, _ZERO_AT)], s=120, facecolors="none", edgecolors="red")
    ax.set(
        title=f"{b.model}: parameter distance between the runs (dashed: noise; 0 at {_ZERO_AT:g})",
        xlabel="checkpointed step",
        ylabel="max |b - a| / max |a|",
        yscale="log",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)
