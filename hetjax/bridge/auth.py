"""The per-job secret and the challenge-response every connection passes.

Both ends prove knowledge of the secret without sending it: each sends a
fresh nonce, then an HMAC-SHA256 over both nonces, its role and the
connector's identity. Roles and purposes are in the MAC so that no proof can
be replayed in another direction or on another kind of connection. Messages
have fixed sizes, so nothing past the handshake is ever read here: a data
socket goes to the native transport with its stream untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct

from hetjax.errors import AuthenticationError, BridgeError

_MAGIC = b"HETJAX1\n"
_NONCE_BYTES = 32
_MAC_BYTES = hashlib.sha256().digest_size
_IDENTITY = struct.Struct("!ii")  # (rank, stream index); stream -1: control

RENDEZVOUS = b"rendezvous"
DATA = b"data"


def load_secret(environ=None) -> bytes:
    """The job secret from HETJAX_SECRET or HETJAX_SECRET_FILE (mode 0600)."""
    environ = os.environ if environ is None else environ
    if environ.get("HETJAX_SECRET"):
        return environ["HETJAX_SECRET"].encode()
    path = environ.get("HETJAX_SECRET_FILE")
    if not path:
        raise BridgeError(
            "no job secret: set HETJAX_SECRET or HETJAX_SECRET_FILE (hetjax.launch sets HETJAX_SECRET for you)"
        )
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BridgeError(
            f"HETJAX_SECRET_FILE {path} has mode {stat.filemode(mode)}; "
            f"expected no access for group and others (chmod 600)"
        )
    with open(path, "rb") as f:
        secret = f.read().strip()
    if not secret:
        raise BridgeError(f"HETJAX_SECRET_FILE {path} is empty")
    return secret


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise AuthenticationError(
                f"connection closed during the handshake while waiting for "
                f"{what} ({got} of {n} bytes came): the other side refused "
                f"us, most likely because our secrets differ"
            )
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _mac(secret: bytes, purpose: bytes, role: bytes, theirs: bytes, ours: bytes, identity: bytes) -> bytes:
    return hmac.new(secret, b"|".join((purpose, role, theirs, ours, identity)), hashlib.sha256).digest()


def connect_handshake(
    sock: socket.socket, secret: bytes, purpose: bytes, rank: int, stream: int, timeout_s: float
) -> None:
    """Authenticate the connecting side as (rank, stream); verify the peer."""
    sock.settimeout(timeout_s)
    nonce = secrets.token_bytes(_NONCE_BYTES)
    identity = _IDENTITY.pack(rank, stream)
    sock.sendall(_MAGIC + nonce + identity)
    hello = _recv_exact(sock, len(_MAGIC) + _NONCE_BYTES, "the peer's nonce")
    if hello[: len(_MAGIC)] != _MAGIC:
        raise AuthenticationError(f"expected a hetjax endpoint, got {hello[: len(_MAGIC)]!r}")
    theirs = hello[len(_MAGIC) :]
    sock.sendall(_mac(secret, purpose, b"connector", theirs, nonce, identity))
    proof = _recv_exact(sock, _MAC_BYTES, "the peer's proof")
    expected = _mac(secret, purpose, b"acceptor", nonce, theirs, identity)
    if not hmac.compare_digest(proof, expected):
        raise AuthenticationError("the peer's proof does not match our secret: refusing it")
    sock.settimeout(None)


def accept_handshake(sock: socket.socket, secret: bytes, purpose: bytes, timeout_s: float) -> tuple[int, int]:
    """Verify the connecting side; returns its (rank, stream).

    Raises AuthenticationError (and sends nothing that proves our secret)
    when the connector fails; the caller closes the socket.
    """
    sock.settimeout(timeout_s)
    hello = _recv_exact(sock, len(_MAGIC) + _NONCE_BYTES + _IDENTITY.size, "the connector's hello")
    if hello[: len(_MAGIC)] != _MAGIC:
        raise AuthenticationError(f"expected a hetjax connector, got {hello[: len(_MAGIC)]!r}")
    theirs = hello[len(_MAGIC) : len(_MAGIC) + _NONCE_BYTES]
    identity = hello[len(_MAGIC) + _NONCE_BYTES :]
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sock.sendall(_MAGIC + nonce)
    proof = _recv_exact(sock, _MAC_BYTES, "the connector's proof")
    expected = _mac(secret, purpose, b"connector", nonce, theirs, identity)
    rank, stream = _IDENTITY.unpack(identity)
    if not hmac.compare_digest(proof, expected):
        raise AuthenticationError(
            f"a connection claiming rank {rank} stream {stream} failed authentication (wrong secret): refused"
        )
    sock.sendall(_mac(secret, purpose, b"acceptor", theirs, nonce, identity))
    sock.settimeout(None)
    return rank, stream
