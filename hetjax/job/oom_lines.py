"""Out-of-memory seen in the workers' output, where the worker could not say
so itself.

A worker that catches XLA's RESOURCE_EXHAUSTED reports it in one line and
exits (hetjax/job/oom.py). Some allocations fail where Python never sees
them: XLA's CUDA-graph instantiation retries after an out-of-memory error
and, failing again, aborts the process (SIGABRT) from C++. The launcher
passes every worker line through here on its way to the terminal, so the
parent can still name the island that ran out.
"""

from __future__ import annotations

import re
import threading

# What XLA and the GPU runtimes print when device memory runs out.
MARKERS = (
    "RESOURCE_EXHAUSTED",
    "after OOM error",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "hipErrorOutOfMemory",
)
_PREFIX = re.compile(r"^\[([^\]]+)\]")


class OutOfMemoryLines:
    """A text stream that passes everything on to `output` and remembers the
    islands (the "[name]" a launcher puts before each worker line) whose
    lines told of device memory running out."""

    def __init__(self, output):
        self.output = output
        self.islands: list[str] = []
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            for line in lines:
                self._scan(line)
        return self.output.write(text)

    def flush(self) -> None:
        self.output.flush()

    def _scan(self, line: str) -> None:
        found = _PREFIX.match(line)
        if found and any(marker in line for marker in MARKERS) and found.group(1) not in self.islands:
            self.islands.append(found.group(1))
