"""What the parent prints of its workers' output: their lines above the
progress bar, never inside it, and no jax.distributed shutdown noise after
a successful run, while a failed run shows every line."""

import io
import sys
import threading

import pytest
from rich.console import Console

from hetjax.job.progress import ProgressBar
from hetjax.launch import ProcessSpec, run_local
from hetjax.shutdown_noise import ShutdownNoise
from tests.pipeline.test_multiprocess_islands import RUNS

# What a process of a multi-process island may print as its cluster shuts down.
NOISE = [
    "E1127 16:00:00.000000 1234 coordination_service_agent.cc:618] WatchTasksAsync failed for task "
    "/job:jax_worker/replica:0/task:1: CANCELLED: Cancelled",
    "Additional GRPC error information from remote target coordination_service while calling "
    "/xla.coordination.CoordinationService/WatchTasks:",
    ':{"created":"@1764259200.0","grpc_message":"Cancelled","grpc_status":1}',
    "=== Source Location Trace: ===",
    "xla/tsl/distributed_runtime/rpc/grpc_util.h:76",
]
# The same block as a later jaxlib prints it after its first line (seen on 2 x H100).
NOISE_LATER_JAXLIB = [
    NOISE[0],
    ":CANCELLED:CANCELLED [type.googleapis.com/tensorflow.DerivedStatus='']",
    "=== Source Location Trace: === ",
    "external/xla+/xla/tsl/distributed_runtime/rpc/grpc_util.h:89",
]

# The watch sent after the service stopped, as a two-process GPU island printed it (2 x H200).
NOISE_SERVICE_GONE = [
    "W1128 09:52:49.719799    8848 pjrt_client.cc:1605] WatchTasksAsync failed for task 0: UNAVAILABLE: failed to "
    "connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:13936: Failed to connect to remote host: "
    "Connection refused",
    "Additional GRPC error information from remote target coordination_service while calling "
    "/xla.coordination.CoordinationService/WatchTasks:",
    ":UNAVAILABLE:failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:13936: Failed to connect "
    "to remote host: Connection refused",
    "=== Source Location Trace: ===",
    "external/xla+/xla/tsl/distributed_runtime/rpc/grpc_util.h:89",
    "",
]


def test_only_the_shutdown_block_is_noise():
    noise = ShutdownNoise()
    lines = ["step 3 done", *NOISE, "", "Traceback (most recent call last):", "  File x.py"]
    assert [noise.holds(line) for line in lines] == [False] + [True] * 6 + [False, False]
    later = ShutdownNoise()
    lines = ["step 3 done", *NOISE_LATER_JAXLIB, "", "E1127 cuda_executor.cc:1365] Failed to allocate"]
    assert [later.holds(line) for line in lines] == [False] + [True] * 5 + [False]
    gone = ShutdownNoise()
    lines = ["step 3 done", *NOISE_SERVICE_GONE, "W1128 other.cc:1] UNAVAILABLE: the bridge peer left"]
    assert [gone.holds(line) for line in lines] == [False] + [True] * 6 + [False]


def printing(code: int) -> list[str]:
    """A process that trains, prints the shutdown noise and exits with `code`."""
    return [sys.executable, "-c", f"import sys; print('trained'); print('\\n'.join({NOISE!r})); sys.exit({code})"]


def test_shutdown_noise_is_dropped_after_success_and_shown_after_a_failure():
    ok = io.StringIO()
    assert run_local([ProcessSpec("a", printing(0)), ProcessSpec("b", printing(0))], output=ok) == [0, 0]
    assert ok.getvalue().count("trained") == 2 and "WatchTasks" not in ok.getvalue() and "grpc" not in ok.getvalue()
    failed = io.StringIO()
    codes = run_local([ProcessSpec("a", printing(0)), ProcessSpec("b", printing(3))], output=failed)
    assert 3 in codes
    for line in NOISE:
        assert f"[b] {line}\n" in failed.getvalue(), failed.getvalue()


@pytest.mark.slow  # a training job of four worker processes
def test_a_successful_multi_process_island_run_ends_quietly(shared_runs):
    output = shared_runs.output(*RUNS["pairs"])  # two islands of two processes each
    assert "WatchTasks" not in output and "CANCELLED" not in output, output[-3000:]


def test_worker_lines_print_above_the_progress_bar(tmp_path):
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with ProgressBar(3, enabled=True, console=console) as bar:
        worker = threading.Thread(target=lambda: bar.output.write("[island0] bridge rank 0 at 127.0.0.1\n"))
        worker.start()
        bar.follow(worker, tmp_path / "metrics.jsonl")
    # Through the bar's console: the bar's line is erased first and the worker's printed whole.
    assert "\x1b[2K[island0] bridge rank 0 at 127.0.0.1\n" in screen.getvalue(), repr(screen.getvalue())
