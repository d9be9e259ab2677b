"""drift.png: error against layer depth, a panel per quantity, a line per
island, the dtype's noise dashed under them; a flagged point is ringed."""

from __future__ import annotations

import pathlib

from hetjax.drift.compare import Entry, worst_per_part
from hetjax.plots import _figure, _save

PLOT_FILE = "drift.png"
_PANELS = ("activation", "gradient", "update")
# A log axis cannot show zero: an exact match is drawn at this height.
_ZERO_AT = 1e-10


def plot_drift(entries: list[Entry], parts: list[str], path: pathlib.Path, title: str = "") -> pathlib.Path:
    """Per panel, each island's worst error per part (the loss sits at the
    activation panel's end), and the noise of the same arrays."""
    fig, axes = _figure(len(_PANELS), (5.0 * len(_PANELS), 4.2))
    worst = worst_per_part(entries)
    islands = sorted({e.island for e in entries})
    labels = [*parts, "loss"]
    for ax, quantity in zip(axes, _PANELS):
        wanted = {quantity, "loss"} if quantity == "activation" else {quantity}
        for island in islands:
            rows = sorted((e for e in worst if e.island == island and e.quantity in wanted), key=lambda e: e.depth)
            if not rows:
                continue
            (line,) = ax.plot(
                [e.depth for e in rows], [max(e.error, _ZERO_AT) for e in rows], marker="o", markersize=3, label=island
            )
            flagged = [e for e in rows if e.flagged]
            ax.scatter(
                [e.depth for e in flagged],
                [max(e.error, _ZERO_AT) for e in flagged],
                s=80,
                facecolors="none",
                edgecolors=line.get_color(),
            )
            ax.plot(
                [e.depth for e in rows],
                [max(e.noise, _ZERO_AT) for e in rows],
                linestyle="--",
                color=line.get_color(),
                alpha=0.5,
            )
        ax.set(
            title=f"{quantity} (dashed: dtype noise; 0 at {_ZERO_AT:g})",
            xlabel="layer",
            ylabel="max |diff| / max |ref|",
            yscale="log",
        )
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)
