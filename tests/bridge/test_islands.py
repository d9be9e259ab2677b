"""Islands as separate processes talking over the bridge (CPU platform).

Every test runs its processes under run_local with a hard timeout, so a
broken bridge fails the test instead of hanging CI.
"""

import re

import pytest

from hetjax.cluster import parse_islands
from hetjax.launch import free_port

pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")


def _pair(script, args=(), env0=None, env1=None):
    return [("island0", script, list(args), env0 or {}), ("island1", script, list(args), env1 or {})]


# The links workers/transfers.py runs over (roundtrip.py's and recv_into.py's
# exchanges), by the environment that picks them.
LINKS = {
    "tcp": {"HETJAX_TRANSPORT": "tcp"},
    # shm asked for by name; "slots" gets it from HETJAX_TRANSPORT=auto.
    "shm": {"HETJAX_TRANSPORT": "shm"},
    # The CPU end of a GPU <-> CPU slot channel (cc/ffi/gpu/host_channel.h)
    # at both ends: what a CPU island does towards a GPU island, runnable
    # without a GPU.
    "slots": {"HETJAX_GPU_PATH": "host"},
}


@pytest.fixture(scope="module")
def _transfer_launches():
    return {}


@pytest.fixture
def transfers_over(run_workers, _transfer_launches):
    """run(link) -> (exit codes, output) of workers/transfers.py on a pair of
    islands over `link` (LINKS): launched once per module for the tests of
    both exchanges (each prints its output)."""

    def run(link):
        if link in _transfer_launches:
            print(_transfer_launches[link][1])
        else:
            _transfer_launches[link] = run_workers(
                _pair("transfers.py"), timeout_s=180, JAX_PLATFORMS="cpu", HETJAX_TIMEOUT="60", **LINKS[link]
            )
        return _transfer_launches[link]

    return run


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_every_dtype_and_shape_round_trips_bitwise(transfers_over, transport):
    codes, out = transfers_over(transport)
    assert codes == [0, 0]
    assert f"OK rank 1 over ['{transport}'], slots ['None']" in out


def test_cpu_islands_asking_for_slots_round_trip_through_the_cpu_end(transfers_over):
    # 64 MiB messages span two of the CPU end's 32 MiB slots.
    codes, out = transfers_over("slots")
    assert codes == [0, 0]
    assert "OK rank 1 over ['shm'], slots ['cpu']" in out


def test_three_islands_in_a_ring_match_out_of_order_tags(run_workers):
    specs = [(f"island{r}", "ring.py", [], {}) for r in range(3)]
    codes, out = run_workers(specs, timeout_s=90, HETJAX_TCP_STREAMS="2")
    assert codes == [0, 0, 0]
    assert out.count("messages matched by tag") == 3


def test_two_process_island_talks_to_a_single_process_island(run_workers):
    pair_env = {
        "HETJAX_TEST_ISLAND_COORDINATOR": f"127.0.0.1:{free_port()}",
        "XLA_FLAGS": parse_islands("cpu*2")[0].process_env()["XLA_FLAGS"],
        "HETJAX_ISLAND": "pair",
    }
    specs = [
        ("pair0", "island.py", [], pair_env),
        ("pair1", "island.py", [], pair_env),
        ("solo", "island.py", [], {"HETJAX_ISLAND": "solo"}),
    ]
    codes, out = run_workers(specs, timeout_s=120)
    assert codes == [0, 0, 0]
    assert "island psum 10.0 == bridge sum 10.0" in out


def test_mismatched_dtype_or_shape_names_both_sides(run_workers):
    codes, out = run_workers(_pair("mismatch.py"), timeout_s=90)
    assert codes == [0, 0]
    assert re.search(r"jit error: .*tag 7.*", out)


@pytest.mark.parametrize(
    "mode,error,at_most_s",
    [
        ("exit", "PeerLostError", 8.0),
        ("silent", "BridgeTimeoutError", 12.0),
    ],
)
def test_survivor_raises_instead_of_hanging(run_workers, mode, error, at_most_s):
    codes, out = run_workers(_pair("dead_peer.py", [mode]), timeout_s=60, HETJAX_TIMEOUT="4")
    assert codes == [0, 0]
    took = float(re.search(rf"raised {error} after ([\d.]+) s", out).group(1))
    assert took <= at_most_s
    if mode == "silent":
        assert took >= 3.5  # it waited for the configured timeout


def test_wrong_secret_is_refused_and_the_job_still_runs(run_workers):
    specs = [
        ("island0", "ping.py", [], {}),
        ("island1", "ping.py", [], {"HETJAX_TEST_PING_DELAY": "3"}),
        ("rogue", "rogue.py", [], {}),
    ]
    codes, out = run_workers(specs, timeout_s=90, HETJAX_WORLD_SIZE="2")
    assert codes == [0, 0, 0]
    assert "OK rogue refused" in out
    assert "OK rank 0" in out and "OK rank 1" in out


@pytest.mark.parametrize("path", LINKS)
def test_recv_into_a_donated_buffer_reuses_its_memory(transfers_over, path):
    codes, out = transfers_over(path)
    assert codes == [0, 0]
    link = {"tcp": "tcp x4", "shm": "shm", "slots": "shm + gpu cpu"}[path]
    assert f"OK rank 1 recv_into over ['{link}']" in out
