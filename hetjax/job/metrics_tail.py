"""Reading the rows a running job adds to metrics.jsonl, as they come: the
parent's watchdog and TensorBoard log each follow the file with one."""

from __future__ import annotations

import json
import pathlib


class MetricsTail:
    def __init__(self, path: str | pathlib.Path):
        self.path = pathlib.Path(path)
        self._offset = 0

    def new_rows(self) -> list[dict]:
        """The complete rows written since the last call (a row still being
        written waits for the next); a row that is not JSON is skipped."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                new = f.read()
        except FileNotFoundError:
            return []
        complete = new[: new.rfind(b"\n") + 1]
        self._offset += len(complete)
        rows = []
        for line in complete.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        return rows
