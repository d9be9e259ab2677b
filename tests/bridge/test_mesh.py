"""Pair planning and the data-connection acceptor, in one process."""

import socket

import pytest

from hetjax.bridge import mesh
from hetjax.errors import AuthenticationError, RendezvousError


def _record(host_id="h/1", transport="auto", streams=4):
    return {"host_id": host_id, "transport": transport, "tcp_streams": streams}


def test_same_host_auto_uses_shm_with_mirrored_ring_names():
    a = mesh.plan_link(0, _record(), 1, _record(), "n1")
    b = mesh.plan_link(1, _record(), 0, _record(), "n1")
    assert a.kind == b.kind == "shm" and a.tcp_streams == 1
    assert a.outbound_shm == b.inbound_shm == "/hetjax-n1-0-1"
    assert a.inbound_shm == b.outbound_shm == "/hetjax-n1-1-0"


def test_tcp_when_asked_or_across_hosts_with_agreed_streams():
    assert mesh.plan_link(0, _record(streams=2), 1, _record(transport="tcp"), "n").tcp_streams == 2
    link = mesh.plan_link(0, _record(), 1, _record(host_id="h/2", streams=3), "n")
    assert (link.kind, link.tcp_streams) == ("tcp", 3)


def test_conflicting_or_impossible_transports_are_refused():
    with pytest.raises(RendezvousError, match="HETJAX_TRANSPORT"):
        mesh.plan_link(0, _record(transport="shm"), 1, _record(transport="tcp"), "n")
    with pytest.raises(RendezvousError, match="different hosts"):
        mesh.plan_link(0, _record(transport="shm"), 1, _record(host_id="x"), "n")


def test_acceptor_refuses_wrong_secret_and_keeps_accepting():
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = {"host": "127.0.0.1", "port": listener.getsockname()[1]}
    acceptor = mesh.Acceptor(listener, b"right", {(1, 0), (1, 1)}, 10.0)
    with pytest.raises(AuthenticationError):
        mesh.connect_streams(1, 0, endpoint, 1, b"wrong", 5.0)
    good = mesh.connect_streams(1, 0, endpoint, 2, b"right", 5.0)
    accepted = acceptor.result(0)
    assert sorted(accepted) == [(1, 0), (1, 1)]
    # The accepted sockets are the two ends of our good connections.
    for stream, conn in enumerate(good):
        conn.sendall(b"%d" % stream)
        assert accepted[(1, stream)].recv(1) == b"%d" % stream
    for conn in good:
        conn.close()
    acceptor.close()
    listener.close()


def test_acceptor_names_missing_ranks_on_timeout():
    listener = socket.create_server(("127.0.0.1", 0))
    acceptor = mesh.Acceptor(listener, b"s", {(2, 0), (3, 0)}, 0.3)
    with pytest.raises(RendezvousError, match=r"rank\(s\) \[2, 3\]"):
        acceptor.result(1)
    listener.close()
