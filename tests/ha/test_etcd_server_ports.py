"""The test etcd starts even when a port it was handed is taken before it binds (a CI flake seen once)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.etcd_server import EtcdServer


def test_a_taken_client_port_is_replaced(tmp_path: Path) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    try:
        server = EtcdServer(tmp_path / "etcd")
        server.client_port = squatter.getsockname()[1]
        server.endpoint = f"127.0.0.1:{server.client_port}"
        with server:
            assert server.client_port != squatter.getsockname()[1]
            assert server.endpoint == f"127.0.0.1:{server.client_port}"
            assert server.proc is not None and server.proc.poll() is None
    finally:
        squatter.close()
