"""Fuzzing the rendezvous service: before authentication (any bytes) and after
(any line). It must answer or close, never crash a thread, never store
anything from a refused request, and keep serving honest clients."""

import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetjax.bridge import auth
from hetjax.bridge.rendezvous import MAX_LINE_BYTES, RendezvousClient, RendezvousServer
from hetjax.errors import RendezvousError
from hetjax.launch import free_port

SECRET = b"fuzz-secret"


def fuzz(examples):
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def service():
    crashes = []
    previous = threading.excepthook
    threading.excepthook = lambda args: crashes.append(args)
    address = f"127.0.0.1:{free_port()}"
    server = RendezvousServer(address, SECRET, handshake_timeout_s=2.0)
    yield address, crashes
    server.stop(grace_s=1.0)
    threading.excepthook = previous
    assert not crashes, [f"{c.exc_type.__name__}: {c.exc_value}" for c in crashes]


def honest_round_trip(address, key):
    client = RendezvousClient(address, SECRET, rank=0, timeout_s=10)
    try:
        client.set(key, {"host": "127.0.0.1", "port": 1})
        assert client.get_many([key], timeout_s=1, what="the check") == [{"host": "127.0.0.1", "port": 1}]
    finally:
        client.close()


def authenticated(address):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    auth.connect_handshake(sock, SECRET, auth.RENDEZVOUS, 0, -1, 10)
    sock.settimeout(10)
    return sock, sock.makefile("rwb")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
requests = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"op": st.sampled_from(["set", "get_many", "del", ""]) | st.text(max_size=8)},
        optional={
            "key": json_values,
            "value": json_values,
            "keys": json_values,
            "timeout_s": st.sampled_from([float("nan"), float("inf"), -1, "1", True, None, 0, 0.01]),
        },
    ),
)


@fuzz(150)
@given(raw=st.binary(max_size=200))
def test_unauthenticated_bytes_are_refused(service, raw):
    address, _ = service
    host, port = address.rsplit(":", 1)
    reply = b""
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            while chunk := sock.recv(4096):
                reply += chunk
        except (ConnectionResetError, BrokenPipeError):
            # The service hung up on the bad bytes while some were still
            # unread (the kernel answers that with a reset): a refusal too.
            pass
    # At most the server's own hello (magic + nonce): never a proof, never data.
    assert len(reply) <= 8 + 32


@fuzz(300)
@given(
    lines=st.lists(
        st.one_of(
            requests.map(lambda r: json.dumps(r).encode()), st.binary(max_size=60).filter(lambda b: b"\n" not in b)
        ),
        min_size=1,
        max_size=5,
    )
)
def test_any_request_line_gets_an_answer(service, lines):
    address, _ = service
    sock, stream = authenticated(address)
    with sock, stream:
        for line in lines:
            stream.write(line + b"\n")
            stream.flush()
            reply = json.loads(stream.readline())
            assert reply["ok"] is True or isinstance(reply.get("error"), str) or "missing" in reply


def test_service_still_serves_honest_clients_after_the_fuzz(service):
    honest_round_trip(service[0], "after-fuzz")


def test_an_endless_line_is_cut_off_without_buffering_it(service):
    address, _ = service
    sock, stream = authenticated(address)
    with sock, stream:
        stream.write(b"x" * (MAX_LINE_BYTES + 10))
        stream.flush()
        reply = json.loads(stream.readline())
        assert reply == {"ok": False, "error": f"request longer than {MAX_LINE_BYTES} bytes"}
        assert stream.readline() == b""  # the service hung up
    honest_round_trip(address, "after-long-line")


def test_a_nan_timeout_is_refused_at_once(service):
    sock, stream = authenticated(service[0])
    with sock, stream:
        start = time.monotonic()
        stream.write(b'{"op": "get_many", "keys": ["never"], "timeout_s": NaN}\n')
        stream.flush()
        reply = json.loads(stream.readline())
        assert "finite number" in reply["error"] and time.monotonic() - start < 2


def test_a_frozen_service_does_not_hold_a_client_forever():
    """A rank 0 that accepts and authenticates but never answers (frozen,
    network gone): the client's call fails within its timeout plus slack."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    held = []

    def accept_and_freeze():
        conn, _ = listener.accept()
        auth.accept_handshake(conn, SECRET, auth.RENDEZVOUS, 5)
        held.append(conn)

    thread = threading.Thread(target=accept_and_freeze, daemon=True)
    thread.start()
    import hetjax.bridge.rendezvous as rendezvous

    slack, rendezvous._REPLY_SLACK_S = rendezvous._REPLY_SLACK_S, 0.5
    try:
        client = RendezvousClient(address, SECRET, rank=3, timeout_s=5)
        start = time.monotonic()
        with pytest.raises(RendezvousError, match="rank 3: the rendezvous service did not answer get_many"):
            client.get_many(["peer"], timeout_s=0.5, what="peers")
        assert time.monotonic() - start < 3
        client.close()
    finally:
        rendezvous._REPLY_SLACK_S = slack
        for conn in held:
            conn.close()
        listener.close()
