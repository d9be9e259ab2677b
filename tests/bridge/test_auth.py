"""Challenge-response: right secrets pass both ways, wrong ones fail both."""

import os
import socket
import threading

import pytest

from hetjax.bridge import auth
from hetjax.errors import AuthenticationError, BridgeError


def _handshake(connector_secret, acceptor_secret, purpose_c=auth.DATA, purpose_a=auth.DATA):
    a, b = socket.socketpair()
    results = {}

    def accept():
        try:
            results["accept"] = auth.accept_handshake(b, acceptor_secret, purpose_a, 5.0)
        except AuthenticationError as e:
            results["accept"] = e
            b.close()  # what the real acceptor does on failure

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        auth.connect_handshake(a, connector_secret, purpose_c, 3, 1, 5.0)
        results["connect"] = "ok"
    except AuthenticationError as e:
        results["connect"] = e
    thread.join(10)
    a.close()
    b.close()
    return results


def test_same_secret_authenticates_and_names_the_connector():
    results = _handshake(b"s3cret", b"s3cret")
    assert results == {"accept": (3, 1), "connect": "ok"}


def test_wrong_secret_is_refused_on_both_sides():
    results = _handshake(b"wrong", b"s3cret")
    assert isinstance(results["accept"], AuthenticationError)
    assert "rank 3 stream 1" in str(results["accept"])
    assert isinstance(results["connect"], AuthenticationError)


def test_proof_for_one_purpose_does_not_open_another():
    results = _handshake(b"s3cret", b"s3cret", purpose_c=auth.RENDEZVOUS)
    assert isinstance(results["accept"], AuthenticationError)


def test_secret_file_must_be_private(tmp_path):
    path = tmp_path / "secret"
    path.write_text("abc\n")
    os.chmod(path, 0o644)
    with pytest.raises(BridgeError, match="chmod 600"):
        auth.load_secret({"HETJAX_SECRET_FILE": str(path)})
    os.chmod(path, 0o600)
    assert auth.load_secret({"HETJAX_SECRET_FILE": str(path)}) == b"abc"
    assert auth.load_secret({"HETJAX_SECRET": "xyz"}) == b"xyz"
    with pytest.raises(BridgeError, match="HETJAX_SECRET"):
        auth.load_secret({})
