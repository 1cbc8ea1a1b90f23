"""Listening on an address as the only process there: a port someone already serves is an error.

gRPC's core sets SO_REUSEPORT by default, so a second controller (or relay) on the same port
binds without complaint and the kernel splits agents and queries between the two. Every server
of ours takes its options from ``GRPC_SERVER_OPTIONS`` (reuse off) and binds through
``add_grpc_port``; an HTTP listener is probed with ``ensure_free`` before it opens. A failure is a
``ListenError`` naming the setting and the address, which the CLI prints as one line.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

# Never share a port with another process (gRPC's default is SO_REUSEPORT on).
GRPC_SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (("grpc.so_reuseport", 0),)


class ListenError(OSError):
    """``what`` (a setting such as ``server.listen``) cannot listen on ``address``: ``reason``."""

    def __init__(self, what: str, address: str, reason: str) -> None:
        super().__init__(f"{what} {address}: {reason}")
        self.what = what
        self.address = address
        self.reason = reason


def _host_port(what: str, address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ListenError(what, address, "not HOST:PORT")
    return host.strip("[]"), int(port)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "address already in use (another process serves this port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address"
    if exc.errno == errno.EACCES:
        return "permission denied (a port below 1024 needs privileges)"
    return exc.strerror or str(exc)


def ensure_free(what: str, address: str) -> None:
    """Raise ListenError when nothing could listen on ``address`` now (in use, not ours, no such host).

    Port 0 (any free port) is always free. The probe binds like a server does (SO_REUSEADDR, which on
    Linux still refuses a port another socket listens on) and closes at once.
    """
    host, port = _host_port(what, address)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(what, address, f"cannot resolve host {host!r}: {exc.strerror}") from None
    for family, kind, proto, _name, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise ListenError(what, address, _reason(exc)) from None


def add_grpc_port(what: str, server: Any, address: str, credentials: Any = None) -> int:
    """Bind ``server`` (built with GRPC_SERVER_OPTIONS) to ``address``; the port, or ListenError."""
    ensure_free(what, address)  # a clear reason; gRPC's own failure says only "Failed to bind"
    try:
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:  # taken between the probe and the bind
        raise ListenError(what, address, "cannot bind (address in use or not local)") from None
    if port == 0:
        raise ListenError(what, address, "cannot bind (address in use or not local)")
    return int(port)
