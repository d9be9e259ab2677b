"""What each process sent over the bridge in each step, for the run's
scalar log (hetjax/job/scalar_log.py): <out>/bridge-traffic/rank<R>.jsonl,
one row per step, from the bridge's own counters (`_native.stats()`: bytes
and messages sent and received since the bridge started).

The bridge counts bytes and messages, not the time its transfers take (they
overlap the step's compute), so no time per step is logged. Step 0's row
also holds what crossed before it (a data-parallel job's first broadcast of
the parameters).
"""

from __future__ import annotations

import json
import pathlib
import shutil

FOLDER = "bridge-traffic"
COUNTERS = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")


def remove_rows(out: str | pathlib.Path) -> None:
    """Drops an earlier launch's rows: each launch logs its own steps."""
    shutil.rmtree(pathlib.Path(out) / FOLDER, ignore_errors=True)


def rows_path(out: str | pathlib.Path, rank: int) -> pathlib.Path:
    return pathlib.Path(out) / FOLDER / f"rank{rank}.jsonl"


class BridgeTraffic:
    """In a worker: `after_step(step)` adds the step's counts to the
    process's rows; nothing where this process runs no bridge."""

    def __init__(self, out: str | pathlib.Path, rank: int, since_start: bool = False):
        """`since_start`: the first row counts from the bridge's start (made
        after the first step), else from now."""
        self.path = rows_path(out, rank)
        self._file = None
        self._last = (None if since_start else self._counts()) or dict.fromkeys(COUNTERS, 0)

    @staticmethod
    def _counts() -> dict | None:
        from hetjax import _native
        from hetjax.errors import BridgeError

        try:
            stats = _native.stats()
        except BridgeError:  # a single island: no bridge
            return None
        return {k: int(stats[k]) for k in COUNTERS}

    def after_step(self, step: int) -> None:
        now = self._counts()
        if now is None:
            return
        row = {"step": step, **{k: now[k] - self._last[k] for k in COUNTERS}}
        self._last = now
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w")
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
