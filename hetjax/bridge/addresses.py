"""Which address a rank's bridge listens on and publishes, and the check
that a peer on another host did not publish one nobody else can reach.

A rank listens on HETJAX_BIND. Unset, it takes the local address of its
host's route to the rendezvous (rank 0's host): on one machine that is
127.0.0.1, as before, and across hosts the interface that reaches the first
host, which the other hosts of the job reach as well. A loopback address
published by a rank of another host is a job that cannot connect: it fails
at start-up naming the address, instead of timing out on a refused connect.
"""

from __future__ import annotations

import ipaddress
import socket

from hetjax.bridge.rendezvous import parse_address
from hetjax.errors import RendezvousError

LOOPBACK = "127.0.0.1"


def route_address(host: str, port: int) -> str | None:
    """The local address this host would send from to host:port; None when
    the name does not resolve or no route leads there. A UDP connect only
    picks the route: nothing is sent."""
    try:
        candidates = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in candidates:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(sockaddr)
                return probe.getsockname()[0]
        except OSError:
            continue
    return None


def choose_bind(environ, coordinator: str) -> tuple[str, str]:
    """(address to listen on, where it came from) for this rank's bridge."""
    given = environ.get("HETJAX_BIND", "").strip()
    if given:
        return given, "HETJAX_BIND"
    host, port = parse_address(coordinator)
    route = route_address(host, port)
    if route is None:
        # The rendezvous itself will then fail, naming the coordinator.
        return LOOPBACK, f"default: no route to the rendezvous host {host}"
    return route, f"route to the rendezvous at {coordinator}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def listen(bind: str, bind_from: str, rank: int) -> socket.socket:
    """The bridge's listening socket on `bind`, any free port."""
    try:
        return socket.create_server((bind, 0))
    except OSError as e:
        raise RendezvousError(
            f"rank {rank}: cannot listen on {bind} ({bind_from}): {e}; expected an address "
            f"of one of this host's interfaces"
        ) from None


def check_reachable(me: int, mine: dict, peer: int, theirs: dict) -> None:
    """RendezvousError when one of the pair, on another host than the other,
    published a loopback address. Only when that rank reached the
    rendezvous over a network (its route is not loopback), so that ranks of
    one network namespace under two hostnames still pass."""
    if mine["host_id"] == theirs["host_id"]:
        return
    for rank, rec, other, other_rec in ((peer, theirs, me, mine), (me, mine, peer, theirs)):
        route = rec.get("route")
        if is_loopback(rec.get("host", "")) and route and not is_loopback(route):
            raise RendezvousError(
                f"rank {rank} ({rec['host_id']}) publishes its bridge at {rec['host']}:{rec['port']}, a "
                f"loopback address ({rec.get('bind_from', 'HETJAX_BIND')}), but rank {other} "
                f"runs on another host ({other_rec['host_id']}) and cannot reach it; expected an address "
                f"of rank {rank}'s host that other hosts reach, e.g. {route} (its route to the "
                f"rendezvous): set HETJAX_BIND={route} there, or leave it unset"
            )
