"""The few lines `hetjax train` prints when a run ends.

They are read from the run's summary.json, written by the last stage's
process (hetjax/pipeline/runtime/metrics.py, MetricsWriter.finish; a data-parallel run
adds ``parallel`` and ``shares``, hetjax/pipeline/parallel/data_parallel.py). A figure
the summary lacks is left out, never made up; the JSON file stays the record.
"""

from __future__ import annotations

import pathlib

# Files of a run folder worth naming, in this order, where they exist.
RUN_FILES = ("summary.json", "metrics.jsonl", "eval.jsonl", "job.json", "checkpoints", "tensorboard", "profile")

# MetricsWriter.finish takes the median over the steps after the first two
# (which compile) when a run has more than this many, else the last step.
_STEADY_AFTER_STEPS = 4


def format_summary(
    summary: dict, run_dir: pathlib.Path, plot_path: pathlib.Path | None, wall_s: float | None = None
) -> str:
    """A headline, then one labelled line each for the layout, loss,
    throughput, run folder and plot; `wall_s`: the run's wall time, where the
    caller measured it."""
    lines = [_headline(summary, wall_s)]
    rows = [
        ("layout", _layout(summary)),
        ("loss", _loss(summary)),
        ("throughput", _throughput(summary)),
        ("run folder", _folder(pathlib.Path(run_dir))),
        ("plot", str(plot_path) if plot_path is not None else None),
    ]
    lines += [f"  {label:<11} {text}" for label, text in rows if text]
    return "\n".join(lines)


def _headline(s: dict, wall_s: float | None) -> str:
    text = "trained " + str(s.get("model", "a model"))
    if s.get("steps") is not None:
        first = s.get("first_step") or 0
        ran = s["steps"] - first
        text += f" for {ran} step" + ("s" if ran != 1 else "")
        if first:  # a resumed run: this invocation's steps, then the run's
            text += f" (steps {first} to {s['steps'] - 1}; {s['steps']} in all)"
    islands = s.get("islands")
    if islands:
        text += f" on {len(islands)} island" + ("s" if len(islands) != 1 else "")
        text += " (" + ", ".join(_island(k, name) for k, name in enumerate(islands)) + ")"
    if s.get("devices") is not None:
        text += f", {s['devices']} device" + ("s" if s["devices"] != 1 else "")
    if wall_s is not None:
        text += f", in {wall_s:.1f} s"
    return text


def _island(index: int, entry: str) -> str:
    """'island0:cpu' -> 'cpu'; a name of the user's own stays: 'amd:rocm'."""
    name, _, platform = str(entry).rpartition(":")
    return platform if name == f"island{index}" else str(entry)


def _layout(s: dict) -> str | None:
    parts = []
    if s.get("parallel") == "data":
        parts.append("data parallel")
        shares = s.get("shares")
        if shares:
            parts.append("microbatches per island " + "+".join(str(m) for m in shares))
        elif s.get("microbatches") is not None:
            parts.append(f"{s['microbatches']} microbatches")
    else:
        replicas = s.get("replicas", 1)
        if s.get("schedule"):
            parts.append(str(s["schedule"]))
        if s.get("microbatches") is not None:
            # Per replica, as the plan's header counts them; the summary's count is the job's.
            per_replica = s["microbatches"] // replicas
            parts.append(f"{per_replica} microbatches" + (" per replica" if replicas > 1 else ""))
        layers = s.get("layers_per_stage")
        if layers:
            parts.append("layers per stage " + "+".join(str(n) for n in layers))
        if replicas > 1:
            parts.append(f"x {replicas} pipeline replicas")
    if s.get("grad_wire", "float32") != "float32":
        parts.append(f"gradients cross islands in {s['grad_wire']}")
    return ", ".join(parts) or None


def _loss(s: dict) -> str | None:
    first, last = s.get("first_loss"), s.get("last_loss")
    if first is not None and last is not None:
        text = f"{first:.4f} -> {last:.4f}"
        if s.get("eval_loss") is not None:
            text += f", eval {s['eval_loss']:.4f} after step {s['eval_step']}"
        return text
    if last is not None:
        return f"{last:.4f} (last)"
    return None


def _throughput(s: dict) -> str | None:
    parts = []
    if s.get("tokens_per_s") is not None:
        parts.append(f"{_number(s['tokens_per_s'])} tok/s")
    if s.get("tflops_per_device") is not None:
        parts.append(f"{s['tflops_per_device']:.3g} TFLOP/s per device")
    if s.get("step_time_s") is not None:
        parts.append(_seconds(s["step_time_s"]) + "/step")
    if not parts:
        return None
    steps = s.get("steps")
    if steps is None:
        note = ""
    elif steps > _STEADY_AFTER_STEPS:
        note = "   (median after the first 2 steps, which compile)"
    else:
        note = "   (last step)"
    return "   ".join(parts) + note


def _folder(run_dir: pathlib.Path) -> str:
    present = [name for name in RUN_FILES if (run_dir / name).exists()]
    return str(run_dir) + (f"   ({', '.join(present)})" if present else "")


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _seconds(t: float) -> str:
    return f"{t:.3g} s" if t >= 1 else f"{t * 1e3:.3g} ms"
