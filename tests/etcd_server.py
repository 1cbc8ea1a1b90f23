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
        for attempt in range(3):
            if self._start(binary, attempt):
                return self
            # A port free_port() handed out was taken before etcd bound it (another test's
            # connection got it as its ephemeral port): pick new ones and start again.
            self.client_port, self.peer_port = free_port(), free_port()
            self.endpoint = f"127.0.0.1:{self.client_port}"
        raise RuntimeError("etcd did not start: its ports kept being taken:\n" + self._log()[-2000:])

    def _start(self, binary: str, attempt: int) -> bool:
        """Start etcd; False when it could not bind its ports, RuntimeError for anything else."""
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        data = self.workdir / f"data-{attempt}"
        with (self.workdir / "etcd.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    "--name",
                    "t",
                    "--data-dir",
                    str(data),
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    f"t={peer}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while "ready to serve client requests" not in (log_text := self._log()):
            if "address already in use" in log_text:
                self.__exit__(None, None, None)  # it may linger after the error: do not wait for it
                return False
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError("etcd did not start:\n" + log_text[-2000:])
            time.sleep(0.05)
        return True

    def _log(self) -> str:
        return (self.workdir / "etcd.log").read_text(errors="replace")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=20)
