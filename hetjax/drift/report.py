"""What `hetjax drift` prints and writes: a table of the worst layers, a
line per island naming where it first parts from the reference, and
drift.json with every compared array."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from hetjax.drift.compare import Entry, first_flag, worst_per_part
from hetjax.drift.variants import describe

RESULT_FILE = "drift.json"


def island_line(name: str, about: dict, entries: list[Entry], factor: float) -> str:
    """One island's verdict: the first flagged quantity in the order of computation, or its worst ratio."""
    settings = describe(about.get("variant", {}))
    where = f"{name} ({about.get('platform', '?')}, {about.get('device', '?')}{', ' + settings if settings else ''})"
    first = first_flag(entries)
    if first is None:
        worst = max(entries, key=lambda e: e.ratio)
        return f"{where}: no flag; worst {_label(worst)} at {worst.ratio:.2g} x noise (flag above {factor:g} x)"
    return f"{where}: first parts from the reference at {_label(first)}: error {first.error:.3g}, {first.ratio:.3g} x noise"


def _label(e: Entry) -> str:
    if e.quantity == "loss":
        return "the loss"
    return f"{e.quantity} of {e.part}" + (f" ({e.param})" if e.param else "")


def table(entries: list[Entry], rows: int = 12) -> str:
    """The worst (island, quantity, layer) rows, worst first, as plain text."""
    header = ("island", "quantity", "layer", "worst array", "error", "noise", "x noise", "flag")
    lines = [header]
    for e in worst_per_part(entries)[:rows]:
        lines.append(
            (
                e.island,
                e.quantity,
                e.part,
                e.param or "-",
                f"{e.error:.3g}",
                f"{e.noise:.3g}",
                f"{e.ratio:.3g}",
                "FLAG" if e.flagged else "",
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)


def write_json(folder: pathlib.Path, spec, islands: dict[str, dict], entries: list[Entry]) -> pathlib.Path:
    """drift.json: the settings, each island's platform and first flag, and every entry."""
    by_island = {}
    for name, about in islands.items():
        mine = [e for e in entries if e.island == name]
        first = first_flag(mine)
        by_island[name] = {
            **about,
            "first_flag": dataclasses.asdict(first) if first else None,
            "flags": sum(e.flagged for e in mine),
        }
    result = {
        "spec": dataclasses.asdict(spec),
        "islands": by_island,
        "entries": [dataclasses.asdict(e) for e in entries],
    }
    path = folder / RESULT_FILE
    path.write_text(json.dumps(result, indent=1))
    return path
