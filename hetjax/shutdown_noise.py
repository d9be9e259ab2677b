"""The lines a multi-process island's processes may print as their
jax.distributed cluster shuts down after a successful run, and nothing else.

When the island's coordination service (in its process 0) stops, a process
whose task watch is still in flight logs the cancelled call with its gRPC
details and source trace:

    ... WatchTasksAsync failed for task /job:jax_worker/...: CANCELLED: ...
    Additional GRPC error information from remote target ...
    :{"created":"@...","grpc_message":"Cancelled","grpc_status":1}
    === Source Location Trace: ===
    xla/tsl/distributed_runtime/rpc/grpc_util.h:...

or, where the service was already gone when the watch was sent (seen with
GPU islands), the same block for a call that found no service:

    ... WatchTasksAsync failed for task 0: UNAVAILABLE: failed to connect ...

Harmless after a successful run, it reads as a failure. The launcher
(hetjax/launch.py) holds such lines back and prints them only when a process
of the launch failed, so a failing run still shows every line it printed.
"""

from __future__ import annotations

import re

# The first line of the block: the task watch cancelled, or sent to a
# service already gone; nothing broader.
_START = re.compile(r"WatchTasksAsync failed.*(CANCELLED|UNAVAILABLE)")
# Lines that continue the block: blank or indented lines, gRPC's details
# (a JSON status, or the codes alone: ":CANCELLED:CANCELLED [...]") and the
# status's source trace (file:line, under Bazel's "external/xla+/" too).
_CONTINUATION = re.compile(
    r"^\s*$|^\s|^=== Source Location Trace|^Additional GRPC error information|^:\{|^:[A-Z_]+:"
    r"|^[\w./+-]+\.(cc|h):\d+\s*$"
)


class ShutdownNoise:
    """Tells, line by line, whether one process's output line belongs to
    the shutdown noise above (the lines after its first that continue it)."""

    def __init__(self) -> None:
        self._in_block = False

    def holds(self, line: str) -> bool:
        if _START.search(line):
            self._in_block = True
        elif not (self._in_block and _CONTINUATION.search(line)):
            self._in_block = False
        return self._in_block
