"""Plots drawn into image files: a training run's loss and throughput per step
(`hetjax train` writes <out>/loss.png), the comparison of
bench/bench_train.py results (bench/plot_bench.py) and the collectives'
bus bandwidth against message size (bench/bench_collectives.py).

Figures are drawn on matplotlib's Agg canvas without pyplot: files only, no
display, and no change to the backend of a program that imports hetjax.
matplotlib is imported inside the functions, so `import hetjax` stays light and
works without it.
"""

from __future__ import annotations

import pathlib

# Configurations of bench/bench_train.py and how plot_bench draws them.
BENCH_LABELS = {
    "a": "(a) two islands, bridge",
    "h": "(h) two islands, bridge via host memory",
    "b": "(b) one island, XLA transfers",
    "c": "(c) one island, data parallel",
    "d": "(d) two islands, data parallel over the bridge",
    "e": "(e) one island, data parallel (--parallel data)",
    "r": "(r) pipeline x data over one-device islands (--replicas)",
}
BENCH_STYLES = {"a": "-", "h": "-.", "b": "--", "c": ":", "d": "-", "e": "--", "r": "-."}

# Below this many points a line also marks each step.
_MARK_STEPS_UP_TO = 50


def _figure(columns: int, size: tuple[float, float]):
    """(figure, axes) on an Agg canvas: one row of `columns` panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, columns)


def _save(fig, path) -> pathlib.Path:
    path = pathlib.Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_run(
    metrics_rows: list[dict], path, title: str | None = None, eval_rows: list[dict] | None = None
) -> pathlib.Path:
    """Loss per step and tokens/s per step of one run (rows of its
    metrics.jsonl: step, loss, tokens_per_s, ...) into `path`, with the
    evaluation's loss beside the training loss (rows of eval.jsonl: step,
    eval_loss) where given; returns it."""
    from matplotlib.ticker import MaxNLocator

    if not metrics_rows:
        raise ValueError("no metrics rows to plot")
    fig, (ax_loss, ax_tps) = _figure(2, (11, 4.2))
    marker = "o" if len(metrics_rows) <= _MARK_STEPS_UP_TO else None
    for ax, key in ((ax_loss, "loss"), (ax_tps, "tokens_per_s")):
        rows = [r for r in metrics_rows if r.get(key) is not None]
        ax.plot([r["step"] for r in rows], [r[key] for r in rows], marker=marker, markersize=3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if eval_rows:
        ax_loss.lines[0].set_label("training")
        ax_loss.plot(
            [r["step"] for r in eval_rows], [r["eval_loss"] for r in eval_rows], marker="s", markersize=4, label="eval"
        )
        ax_loss.legend()
    ax_loss.set(title="loss per step", xlabel="step", ylabel="loss")
    ax_tps.set(title="throughput per step (the first steps compile)", xlabel="step", ylabel="tokens/s", yscale="log")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_bench(result: dict, path) -> pathlib.Path:
    """A bench/bench_train.py result: loss per step of the runs whose losses
    are compared ((a), (h), (b); (d), (e)) for one model, and tokens/s per
    step of every run; returns `path`."""
    compared = "ahbde"
    runs = [r for r in result["runs"] if r["per_step"]["loss"]]
    models = list(dict.fromkeys(r["model"] for r in runs))
    # The loss panel shows the model with the longest compared runs.
    loss_model = max(
        models,
        key=lambda m: max(
            (len(r["per_step"]["loss"]) for r in runs if r["model"] == m and r["config"] in compared), default=0
        ),
    )
    fig, (ax_loss, ax_tps) = _figure(2, (13, 4.8))
    for r in runs:
        if r["model"] == loss_model and r["config"] in compared:
            ax_loss.plot(
                r["per_step"]["loss"],
                BENCH_STYLES.get(r["config"], ":"),
                label=BENCH_LABELS.get(r["config"], r["config"]),
            )
    comparison = result["comparisons"].get(loss_model, {})
    diffs = [
        f"{pair} {comparison[key]:.1e}"
        for pair, key in (("a/b", "final_loss_rel_diff"), ("d/e", "d_final_loss_rel_diff"))
        if comparison.get(key) is not None
    ]
    title = f"{loss_model}: loss per step" + (f" (final rel. diff {', '.join(diffs)})" if diffs else "")
    ax_loss.set(title=title, xlabel="step", ylabel="loss")
    ax_loss.legend()
    for r in runs:
        label = f"{r['model']} {BENCH_LABELS.get(r['config'], r['config'])}"
        ax_tps.plot(r["per_step"]["tokens_per_s"], BENCH_STYLES.get(r["config"], ":"), label=label)
    ax_tps.set(title="throughput per step (first steps compile)", xlabel="step", ylabel="tokens/s", yscale="log")
    ax_tps.legend(fontsize=7)
    return _save(fig, path)


def _busbw_label(column: str) -> str:
    name = column.removesuffix("_busbw_GBps")
    if name.startswith("xla_"):
        return f"XLA {name.removeprefix('xla_')}, one island"
    return name.replace("_", " ")


def plot_busbw(result: dict, path) -> pathlib.Path:
    """A bench/bench_collectives.py result: bus bandwidth of every measured
    all-reduce (hetjax's ring and ordered, staged or not, XLA's psum) against
    bytes per device, log-log; returns `path`."""
    rows = sorted(result["rows"], key=lambda r: r["bytes"])
    columns = [c for c in rows[0] if c.endswith("_busbw_GBps")]
    if not columns:
        raise ValueError("expected *_busbw_GBps columns in the result's rows, got none")
    fig, ax = _figure(1, (7.5, 4.8))
    for column in columns:
        points = [(r["bytes"], r[column]) for r in rows if r.get(column)]
        style = "--" if column.startswith("xla") else "-"
        ax.plot(*zip(*points), style, marker="o", markersize=3, label=_busbw_label(column))
    ax.set(xscale="log", yscale="log", xlabel="bytes per device", ylabel="bus bandwidth, GB/s")
    ax.set_title(f"collectives, islands {result.get('islands', '?')}", fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)
