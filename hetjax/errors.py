"""Exceptions the bridge raises.

The native module raises these by status code (see ``error_class``), with
the transport's message unchanged. Programs run under ``jax.jit`` surface a
failing send/recv as jax's own runtime error instead; ``from_xla_error`` turns
such an error back into the matching class.
"""

from __future__ import annotations

import re


class BridgeError(RuntimeError):
    """Base class of every hetjax bridge failure."""


class MismatchError(BridgeError):
    """The message's dtype/shape disagrees with what the receiver expected."""


class BridgeTimeoutError(BridgeError, TimeoutError):
    """Nothing arrived (or no peer answered) within the configured timeout."""


class PeerLostError(BridgeError, ConnectionError):
    """The connection to a peer closed or failed."""


class AuthenticationError(BridgeError):
    """A connection did not prove knowledge of the job's secret."""


class RendezvousError(BridgeError):
    """Start-up could not gather or connect every rank."""


class ConfigError(BridgeError, ValueError):
    """A bridge setting (a HETJAX_* variable or an argument) holds a value the
    bridge cannot take, or ranks differ on one that must be the same on
    every rank."""


_BY_CODE = {
    "mismatch": MismatchError,
    "timeout": BridgeTimeoutError,
    "peer_lost": PeerLostError,
}

# The FFI layer (cc/ffi/handler_core.cc) maps status codes onto these XLA
# error codes; XLA prints them in front of the message.
_XLA_CODE_TO_CODE = {
    "FAILED_PRECONDITION": "mismatch",
    "DEADLINE_EXCEEDED": "timeout",
    "UNAVAILABLE": "peer_lost",
}
_XLA_MESSAGE = re.compile(r"\b([A-Z_]+): (hetjax hetjax_\w+: .*)", re.DOTALL)


def error_class(code: str) -> type[BridgeError]:
    """Exception class for a transport status code name ("mismatch", ...)."""
    return _BY_CODE.get(code, BridgeError)


def from_xla_error(error: BaseException) -> BridgeError | None:
    """The BridgeError a jax runtime error stands for, or None if not ours."""
    match = _XLA_MESSAGE.search(str(error))
    if match is None:
        return None
    cls = error_class(_XLA_CODE_TO_CODE.get(match.group(1), ""))
    return cls(match.group(2))
