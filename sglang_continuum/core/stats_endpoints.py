"""Where the stats exchange binds and connects, and whom it trusts: endpoints (local-only unless the
fleet shares CURVE keys), each data-parallel rank's own endpoint, the fleet's key pair.

What is trusted: a peer that holds the fleet's key (or, without keys, any process on this host).
Nothing here opens a socket; ``stats_exchange.py`` does.
"""

from __future__ import annotations

import ipaddress
from typing import Sequence

ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
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


def connectable(endpoint: str) -> str:
    """Where a sibling rank reaches a bound endpoint: a wildcard tcp host is this host's loopback."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


class FleetKey:
    """ZAP: a subscriber is admitted only with the fleet's public key."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public
