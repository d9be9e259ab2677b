"""A peer that freezes without closing its sockets (SIGSTOP: what a hung
host or a vanished network looks like from the other side) is declared lost
by the heartbeat timeout, not after HETJAX_TIMEOUT and not never."""

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.reliability.bridge_pair import pair_env, start_pair

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
WORKER = Path(__file__).parent / "workers" / "frozen_peer.py"
HEARTBEAT_S = 2.0
DEADLINE_S = 90  # hard limit for the whole test


def lines_of(proc):
    """A queue that receives proc's output lines (None at the end)."""
    out = queue.Queue()

    def pump():
        for line in proc.stdout:
            out.put(line)
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def wait_for(lines, prefix, deadline, seen):
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None or time.monotonic() > deadline:
            pytest.fail(f"no {prefix!r} line in time; output:\n" + "".join(seen)[-3000:])
        seen.append(line)
        if line.startswith(prefix):
            return line


def test_a_frozen_peer_is_lost_within_the_heartbeat_timeout(capsys):
    env = pair_env(
        HETJAX_TIMEOUT="60",  # far above the heartbeat: only it can explain a fast failure
        HETJAX_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S),
    )
    procs = start_pair([str(WORKER)], env, stdin=subprocess.PIPE)
    seen = [[], []]
    try:
        deadline = time.monotonic() + DEADLINE_S
        out0, out1 = lines_of(procs[0]), lines_of(procs[1])
        wait_for(out1, "READY", deadline, seen[1])
        wait_for(out0, "READY", deadline, seen[0])
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        procs[0].stdin.write("go\n")
        procs[0].stdin.flush()
        line = wait_for(out0, "DETECTED", deadline, seen[0])
        noticed = time.monotonic() - stopped
        assert procs[0].wait(timeout=max(1, deadline - time.monotonic())) == 3, "".join(seen[0])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    kind, seconds, message = re.match(r"DETECTED (\w+) after ([\d.]+) s: (.*)", line).groups()
    assert kind == "PeerLostError", line
    assert "peer rank 1 (island isle1) lost: nothing heard from it" in message, message
    assert "last tag received from it: 5" in message, message
    # Silence counts from the last beat heard (at most an interval before the
    # stop), so it is never much early. A loaded 2-core box can make it late by
    # seconds; any time well under HETJAX_TIMEOUT (60 s) still shows that the
    # heartbeat, not the timeout, found the loss.
    assert HEARTBEAT_S * 0.7 < float(seconds) < 30, line
    with capsys.disabled():
        print(
            f"\n[fault] peer frozen by SIGSTOP: rank 0 {kind} {noticed:.2f} s after the stop "
            f"(heartbeat timeout {HEARTBEAT_S} s): {message}"
        )
