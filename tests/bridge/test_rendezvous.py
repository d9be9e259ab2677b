"""The rendezvous service in one process: auth, values, missing keys."""

import threading

import pytest

from hetjax.bridge.rendezvous import RendezvousClient, RendezvousServer
from hetjax.errors import AuthenticationError, RendezvousError
from hetjax.launch import free_port


@pytest.fixture
def server():
    address = f"127.0.0.1:{free_port()}"
    srv = RendezvousServer(address, b"job-secret", handshake_timeout_s=5.0)
    yield address, srv
    srv.stop(grace_s=0.5)


def test_values_flow_between_clients_and_wait_for_late_keys(server):
    address, _ = server
    a = RendezvousClient(address, b"job-secret", 0, 5.0)
    b = RendezvousClient(address, b"job-secret", 1, 5.0)
    a.set("rank/0", {"port": 1234})
    late = threading.Timer(0.2, b.set, args=("rank/1", [1, "x"]))
    late.start()
    assert a.get_many(["rank/0", "rank/1"], 5.0, "ranks") == [{"port": 1234}, [1, "x"]]
    late.join()
    a.close()
    b.close()


def test_timeout_names_the_missing_keys(server):
    address, _ = server
    client = RendezvousClient(address, b"job-secret", 0, 5.0)
    client.set("rank/0", 0)
    with pytest.raises(RendezvousError, match="missing: rank/1, rank/2"):
        client.get_many(["rank/0", "rank/1", "rank/2"], 0.3, "ranks")
    client.close()


def test_wrong_secret_is_refused_and_service_keeps_working(server):
    address, _ = server
    with pytest.raises(AuthenticationError):
        RendezvousClient(address, b"not-the-secret", 5, 5.0)
    client = RendezvousClient(address, b"job-secret", 0, 5.0)
    client.set("k", 1)
    assert client.get_many(["k"], 1.0, "k") == [1]
    client.close()


def test_stop_leaves_no_threads(server):
    address, srv = server
    client = RendezvousClient(address, b"job-secret", 0, 5.0)
    client.close()
    srv.stop(grace_s=0.5)
    assert not [t for t in threading.enumerate() if t.name.startswith("hetjax-rendezvous")]


def test_no_service_fails_with_clear_error():
    with pytest.raises(RendezvousError, match="is rank 0 running"):
        RendezvousClient(f"127.0.0.1:{free_port()}", b"s", 1, 0.3)
