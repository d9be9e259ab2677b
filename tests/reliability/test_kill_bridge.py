"""SIGKILL a bridge rank during start-up and in the middle of a large
message: the survivor raises a clear error within its timeout and exits
non-zero on its own (no launcher stops it here)."""

import re
from pathlib import Path

import pytest

from tests.reliability import bridge_pair
from tests.reliability.bridge_pair import pair_env

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
WORKER = Path(__file__).parent / "workers" / "kill_peer.py"
TIMEOUT_S = 4  # HETJAX_TIMEOUT of the survivor


def run_pair(mode):
    env = pair_env(HETJAX_TIMEOUT=str(TIMEOUT_S), HETJAX_TRANSPORT="tcp")
    return bridge_pair.run_pair([str(WORKER), mode], env, timeout_s=90)


def detected(output):
    """(error kind, seconds from the start of the wait, the machine's
    monotonic clock when it was raised, message)."""
    match = re.search(r"DETECTED (\w+) after ([\d.]+) s at ([\d.]+): (.*)", output)
    assert match, output[-3000:]
    return match.group(1), float(match.group(2)), float(match.group(3)), match.group(4)


def test_rank_killed_before_rendezvous(capsys):
    codes, (out0, _) = run_pair("rendezvous")
    assert codes[1] == -9 and codes[0] == 3, out0[-3000:]
    kind, seconds, _, message = detected(out0)
    assert kind in ("RendezvousError", "BridgeTimeoutError") and "1" in message
    assert seconds < TIMEOUT_S + 12
    with capsys.disabled():
        print(f"\n[fault] rank killed before rendezvous: rank 0 {kind} after {seconds:.2f} s")


def test_rank_killed_with_a_large_message_on_the_wire(capsys):
    codes, (out0, out1) = run_pair("message")
    assert codes[1] == -9 and codes[0] == 3, out0[-3000:] + out1[-2000:]
    kind, _, raised_at, message = detected(out0)
    assert kind == "PeerLostError" and "rank 1" in message, message
    # From the kill, not from the start of rank 0's wait: that also holds
    # rank 1's preparation (256 MiB to fill, a send to compile), seconds on a
    # loaded machine.
    killed_at = re.search(r"KILL AT ([\d.]+)", out1)
    assert killed_at, out1[-2000:]
    seconds = raised_at - float(killed_at.group(1))
    assert 0 <= seconds < TIMEOUT_S, (seconds, message)
    with capsys.disabled():
        print(f"\n[fault] rank killed mid-message: rank 0 {kind} {seconds:.2f} s after the kill: {message}")
