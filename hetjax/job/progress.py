"""A live progress bar of a running job, drawn from the metrics.jsonl lines
the last stage's process writes, with the workers' output printed above it.

The launcher writes every worker line into `ProgressBar.output`, which
prints it through the bar's console: a line written straight to the
terminal would land inside the bar that rich redraws in place.
"""

from __future__ import annotations

import json
import pathlib
import sys
import threading
import time


class ProgressBar:
    """`with ProgressBar(steps, enabled) as bar:` hand `bar.output` to the
    launcher, then `bar.follow(worker, metrics)` until the thread waiting on
    the job's processes ends. Not enabled: no bar, output to stdout."""

    def __init__(self, steps: int, enabled: bool, console=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.steps = steps
        self._progress = None
        self.output = sys.stdout
        if enabled:
            columns = [
                TextColumn("step"),
                MofNCompleteColumn(),
                BarColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(),
            ]
            self._progress = Progress(*columns, console=console, transient=False)
            self.output = ConsoleLines(self._progress.console)

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.steps, loss="-", tps="-")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def follow(self, worker: threading.Thread, metrics: pathlib.Path) -> None:
        """Until `worker` ends: the steps done, the last loss and tokens/s;
        only waits when not enabled."""
        if self._progress is None:
            worker.join()
            return
        seen = 0
        while worker.is_alive() or seen < self.steps:
            lines = metrics.read_text().splitlines() if metrics.exists() else []
            for line in lines[seen:]:
                m = json.loads(line)
                self._progress.update(
                    self._task, completed=m["step"] + 1, loss=f"{m['loss']:.4f}", tps=f"{m['tokens_per_s']:.0f}"
                )
            seen = len(lines)
            if not worker.is_alive():
                break
            time.sleep(0.2)


class ConsoleLines:
    """A text stream that prints each whole line through a rich console, as
    it is (no markup, highlighting or wrapping of its own)."""

    def __init__(self, console):
        self.console = console
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass
