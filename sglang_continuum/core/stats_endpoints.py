"""Where the stats exchange binds and connects, and whom it trusts: endpoints (local-only unless the
fleet shares CURVE keys), each data-parallel rank's own endpoint, which endpoints a rank subscribes
to (``links``, at most ``max_peers`` sockets), the fleet's key pair.

What is trusted: a peer that holds the fleet's key; without keys, any process on this host that
can reach a local endpoint (a loopback tcp port: every local user; an ipc socket: the server's own
user, its file made 0600 at bind).
Nothing here opens a socket; ``stats_exchange.py`` does.
"""

from __future__ import annotations

import ipaddress
from typing import Optional, Sequence

ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
SIBLINGS = -1  # the group of this server's other data-parallel ranks
CurveKeys = tuple[bytes, bytes]  # (public, secret), z85 as zmq.auth writes them


def read_keys(path: str) -> CurveKeys:
    """The key pair in a ``.key_secret`` file written by ``zmq.auth.create_certificates``."""
    import zmq.auth

    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def is_local(endpoint: str) -> bool:
    """ipc and inproc never leave the host; tcp does unless its host is a loopback address."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a hostname, an interface name, "*", a "source;destination" pair
        return False


def check_local(setting: str, endpoints: Sequence[str]) -> None:
    for endpoint in endpoints:
        if not is_local(endpoint):
            raise ValueError(
                f"{setting}: {endpoint!r} is reachable from other hosts; without stats_key_file (CURVE keys) "
                "tool statistics stay on this host (a loopback tcp, ipc or inproc endpoint)"
            )


def rank_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint data-parallel rank ``rank`` uses for a configured ``endpoint``: rank 0 the
    configured one, the others the next ports (tcp) or a ``.dp<rank>`` suffix (ipc, inproc)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        head, _, port = endpoint.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"stats endpoint {endpoint!r}: data-parallel ranks need a numeric port")
        return f"{head}:{int(port) + rank}"
    return f"{endpoint}.dp{rank}"


def links(
    publish_endpoint: Optional[str],
    peer_endpoints: Sequence[str],
    keyed: bool,
    dp_rank: int,
    dp_size: int,
    max_peers: int,
) -> list[tuple[str, int, bool]]:
    """The endpoints to subscribe to, checked: (endpoint, group, decides) -- this server's sibling
    data-parallel ranks (group ``SIBLINGS``), then every rank of each peer endpoint (group: its
    position in the list; ``decides``: the one of this rank, read first, which tells whether the
    entry is this server under another name). ``keyed``: the fleet shares CURVE keys."""
    for endpoint in (publish_endpoint, *peer_endpoints):
        if endpoint is not None and not endpoint.startswith(ENDPOINT_SCHEMES):
            raise ValueError(f"stats endpoint {endpoint!r} must start with one of {ENDPOINT_SCHEMES}")
    if not keyed:
        check_local("stats_publish_endpoint", [publish_endpoint] if publish_endpoint else [])
        check_local("stats_peer_endpoints", peer_endpoints)
    out = []
    if publish_endpoint:
        base = connectable(publish_endpoint)
        out += [(rank_endpoint(base, r), SIBLINGS, False) for r in range(dp_size) if r != dp_rank]
    for group, endpoint in enumerate(peer_endpoints):
        out += [(rank_endpoint(endpoint, r), group, r == dp_rank) for r in range(dp_size)]
    if len(out) > max_peers:
        raise ValueError(f"{len(out)} stats peer sockets (endpoints x dp ranks) is over {max_peers}")
    return out


def connectable(endpoint: str) -> str:
    """Where a sibling rank reaches a bound endpoint: a wildcard tcp host is this host's loopback
    (the IPv6 one for the IPv6 wildcard)."""
    for wildcard, loopback in (("tcp://*:", "127.0.0.1"), ("tcp://0.0.0.0:", "127.0.0.1"), ("tcp://[::]:", "[::1]")):
        if endpoint.startswith(wildcard):
            return f"tcp://{loopback}:" + endpoint[len(wildcard) :]
    return endpoint


class FleetKey:
    """ZAP: a subscriber is admitted only with the fleet's public key."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public
