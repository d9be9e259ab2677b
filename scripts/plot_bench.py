"""Plot a bench_train.py result: loss per step of (a) and (b), and tokens/s per step.

python scripts/plot_bench.py bench/results/train_h200x2.json bench/results/train_h200x2.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "a": "(a) two islands, bridge",
    "h": "(h) two islands, bridge via host memory",
    "b": "(b) one island, XLA transfers",
    "c": "(c) one island, data parallel",
}
STYLES = {"a": "-", "h": "-.", "b": "--", "c": ":"}


def plot(result: dict, path: str) -> None:
    runs = [r for r in result["runs"] if r["per_step"]["loss"]]
    models = list(dict.fromkeys(r["model"] for r in runs))
    # The loss panel shows the model with the longest (a)/(b) runs: the loss comparison.
    loss_model = max(
        models,
        key=lambda m: max(
            (len(r["per_step"]["loss"]) for r in runs if r["model"] == m and r["config"] in "ahb"), default=0
        ),
    )
    fig, (ax_loss, ax_tps) = plt.subplots(1, 2, figsize=(13, 4.8))
    for r in runs:
        if r["model"] == loss_model and r["config"] in "ahb":
            ax_loss.plot(r["per_step"]["loss"], STYLES[r["config"]], label=LABELS[r["config"]])
    diff = result["comparisons"].get(loss_model, {}).get("final_loss_rel_diff")
    title = f"{loss_model}: loss per step"
    ax_loss.set(
        title=title + (f" (final rel. diff {diff:.1e})" if diff is not None else ""), xlabel="step", ylabel="loss"
    )
    ax_loss.legend()
    for r in runs:
        ax_tps.plot(r["per_step"]["tokens_per_s"], STYLES[r["config"]], label=f"{r['model']} {LABELS[r['config']]}")
    ax_tps.set(title="throughput per step (first steps compile)", xlabel="step", ylabel="tokens/s", yscale="log")
    ax_tps.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    plot(json.loads(open(argv[0]).read()), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
