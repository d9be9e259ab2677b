"""A small key-value service for start-up, run by bridge rank 0.

Ranks publish their endpoints and read everyone else's. JSON lines over TCP,
every connection authenticated first (auth.py); values are JSON, never
pickle. Lives only while the bridge starts: once every rank has connected
its peers, rank 0 stops it.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time

from hetjax.bridge import auth
from hetjax.errors import AuthenticationError, RendezvousError

_log = logging.getLogger("hetjax.bridge")
_POLL_S = 0.1
# A request is a short JSON line (a key and an endpoint record); anything
# longer is a broken or hostile client, refused before it can grow memory.
MAX_LINE_BYTES = 1 << 20
# Slack on top of a request's own timeout before a client gives up on a
# service that stopped answering (a frozen or partitioned rank 0).
_REPLY_SLACK_S = 10.0


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RendezvousError(f"expected host:port, got {address!r}")
    return host, int(port)


class RendezvousServer:
    """Serves set/get_many until stop(); one thread per client."""

    def __init__(self, address: str, secret: bytes, handshake_timeout_s: float):
        self._secret = secret
        self._handshake_timeout_s = handshake_timeout_s
        self._values: dict[str, object] = {}
        self._changed = threading.Condition()
        self._stopping = threading.Event()
        self._clients: dict[threading.Thread, socket.socket] = {}
        self._listener = socket.create_server(parse_address(address), reuse_port=False)
        self._listener.settimeout(_POLL_S)
        self._acceptor = threading.Thread(target=self._accept_loop, name="hetjax-rendezvous", daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), name="hetjax-rendezvous-client", daemon=True)
            with self._changed:
                self._clients[thread] = conn
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                try:
                    auth.accept_handshake(conn, self._secret, auth.RENDEZVOUS, self._handshake_timeout_s)
                except (AuthenticationError, OSError) as e:
                    _log.warning("rendezvous refused a connection: %s", e)
                    return
                with conn.makefile("rwb") as stream:
                    while line := stream.readline(MAX_LINE_BYTES + 1):
                        reply = self._reply(line)
                        stream.write(json.dumps(reply).encode() + b"\n")
                        stream.flush()
                        if len(line) > MAX_LINE_BYTES:
                            return  # the rest of that line is not worth reading
        except OSError:
            pass  # client gone or shut down by stop()
        finally:
            with self._changed:
                self._clients.pop(threading.current_thread(), None)

    def _reply(self, line: bytes) -> dict:
        """The reply to one request line; malformed ones get an error reply
        naming what was expected, and nothing else changes."""
        if len(line) > MAX_LINE_BYTES:
            return _refuse(f"request longer than {MAX_LINE_BYTES} bytes")
        try:
            request = json.loads(line)
        except ValueError as e:  # includes bad UTF-8
            return _refuse(f"request is not JSON ({e})")
        problem = _malformed(request)
        return _refuse(problem) if problem else self._handle(request)

    def _handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "set":
            with self._changed:
                self._values[request["key"]] = request["value"]
                self._changed.notify_all()
            return {"ok": True}
        if op == "get_many":
            keys = request["keys"]
            deadline = time.monotonic() + float(request["timeout_s"])
            with self._changed:
                while True:
                    missing = [k for k in keys if k not in self._values]
                    left = deadline - time.monotonic()
                    if not missing:
                        return {"ok": True, "values": [self._values[k] for k in keys]}
                    if left <= 0 or self._stopping.is_set():
                        return {"ok": False, "missing": missing}
                    self._changed.wait(min(left, _POLL_S))
        return _refuse(f"unknown op {op!r}")

    def stop(self, grace_s: float = 5.0) -> None:
        """Lets clients finish their last reply, then closes everything."""
        self._listener.close()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._changed:
                if not self._clients:
                    break
            time.sleep(0.01)
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
            clients = list(self._clients.items())
        for _, conn in clients:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread, _ in clients:
            thread.join()
        self._acceptor.join()


def _refuse(why: str) -> dict:
    _log.warning("rendezvous refused a request: %s", why)
    return {"ok": False, "error": why}


def _malformed(request) -> str | None:
    """What is wrong with a request, or None; the one place its shape is checked."""
    if not isinstance(request, dict):
        return f"expected a JSON object, got {type(request).__name__}"
    op = request.get("op")
    if op == "set":
        if not isinstance(request.get("key"), str) or "value" not in request:
            return "set: expected {op, key: string, value}"
    elif op == "get_many":
        keys, timeout_s = request.get("keys"), request.get("timeout_s")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return "get_many: expected keys: list of strings"
        if (
            not isinstance(timeout_s, (int, float))
            or isinstance(timeout_s, bool)
            or not math.isfinite(timeout_s)
            or timeout_s < 0
        ):
            return f"get_many: expected timeout_s: a finite number >= 0, got {timeout_s!r}"
    return None


class RendezvousClient:
    """One authenticated connection to the rendezvous service."""

    def __init__(self, address: str, secret: bytes, rank: int, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        host, port = parse_address(address)
        while True:
            # Rank 0 may not be serving yet: retry until the deadline.
            try:
                self._sock = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise RendezvousError(
                        f"rank {rank}: no rendezvous service at {address} "
                        f"after {timeout_s:g} s ({e}); is rank 0 running?"
                    ) from None
                time.sleep(_POLL_S)
        try:
            auth.connect_handshake(self._sock, secret, auth.RENDEZVOUS, rank, -1, timeout_s)
        except BaseException:
            self._sock.close()
            raise
        self._stream = self._sock.makefile("rwb")
        self._rank = rank

    def _call(self, request: dict, timeout_s: float = 0.0) -> dict:
        # Bounded: a rank 0 that froze or whose network went away must not
        # hold this rank in start-up forever.
        self._sock.settimeout(timeout_s + _REPLY_SLACK_S)
        try:
            self._stream.write(json.dumps(request).encode() + b"\n")
            self._stream.flush()
            line = self._stream.readline(MAX_LINE_BYTES + 1)
        except (TimeoutError, socket.timeout):
            raise RendezvousError(
                f"rank {self._rank}: the rendezvous service did not answer "
                f"{request['op']} within {timeout_s + _REPLY_SLACK_S:g} s"
            ) from None
        except OSError as e:
            raise RendezvousError(
                f"rank {self._rank}: the rendezvous connection failed during {request['op']} ({e})"
            ) from None
        if not line:
            raise RendezvousError(
                f"rank {self._rank}: the rendezvous service closed the connection during {request['op']}"
            )
        reply = json.loads(line)
        if "error" in reply:
            raise RendezvousError(
                f"rank {self._rank}: the rendezvous service refused {request['op']}: {reply['error']}"
            )
        return reply

    def set(self, key: str, value) -> None:
        self._call({"op": "set", "key": key, "value": value})

    def get_many(self, keys: list[str], timeout_s: float, what: str) -> list:
        """Values of all keys; RendezvousError naming the missing ones."""
        reply = self._call({"op": "get_many", "keys": keys, "timeout_s": timeout_s}, timeout_s)
        if not reply["ok"]:
            raise RendezvousError(
                f"rank {self._rank}: timed out after {timeout_s:g} s waiting "
                f"for {what}; missing: {', '.join(reply['missing'])}"
            )
        return reply["values"]

    def close(self) -> None:
        self._stream.close()
        self._sock.close()
