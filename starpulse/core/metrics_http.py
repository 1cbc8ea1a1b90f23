"""A /metrics HTTP endpoint for one Prometheus collector, on a registry of its own.

The agent and the relay each serve their own exposition; an own registry keeps
prometheus_client's process and GC defaults out of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector

from starpulse.core.listen import ListenError, ensure_free

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


def split_listen(address: str) -> tuple[str, int]:
    """'HOST:PORT' (or ':PORT', '[::1]:PORT') -> (host, port); an empty host means all interfaces."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """prometheus_client's threaded HTTP server on one registry."""

    def __init__(self, server: WSGIServer, registry: CollectorRegistry) -> None:
        self._server = server
        self.registry = registry
        self.port = int(server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve_collector(collector: Collector, listen: str, what: str = "metrics_listen") -> MetricsServer:
    """/metrics of one collector on `listen`, on a registry of its own (the agent's, a relay's).

    ``what`` names the setting in the ListenError raised when the address cannot be served.
    """
    registry = CollectorRegistry()
    registry.register(collector)
    host, port = split_listen(listen)
    ensure_free(what, listen)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:  # taken since the probe
        raise ListenError(what, listen, exc.strerror or str(exc)) from None
    return MetricsServer(server, registry)
