"""A real etcd (Debian's etcd-server) for tests: free ports, a temp data folder, killed and waited on.

Skips the test (pytest.skip) when the etcd binary is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

import pytest

from tests.helpers import free_port

MISSING_REASON = "etcd is not installed (Debian: apt-get install etcd-server)"


class EtcdServer:
    """One single-member etcd on loopback; ``endpoint`` is its client HOST:PORT."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> EtcdServer:
        binary = shutil.which("etcd")
        if binary is None:
            pytest.skip(MISSING_REASON)
        self.workdir.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with (self.workdir / "etcd.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary, "--name", "t", "--data-dir", str(self.workdir / "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", f"t={peer}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while b"ready to serve client requests" not in (self.workdir / "etcd.log").read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("etcd did not start:\n" + (self.workdir / "etcd.log").read_text()[-2000:])
            time.sleep(0.05)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=20)
