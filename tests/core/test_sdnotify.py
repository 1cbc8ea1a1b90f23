"""sd_notify client: a real unix datagram socket stands in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from starpulse.core import sdnotify
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import wait_for


class FakeSystemd:
    """Receives what the service sends, as PID 1 would."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def messages(self, timeout_s: float = 0.0) -> list[str]:
        """Everything queued now (waiting up to timeout_s for the first one)."""
        out: list[str] = []
        if timeout_s > 0:
            self.sock.settimeout(timeout_s)
            try:
                out.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return out
        self.sock.setblocking(False)
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture
def systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    with tempfile.TemporaryDirectory(prefix="spn-", dir="/tmp") as d:  # unix paths are short
        path = str(Path(d) / "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        monkeypatch.delenv("WATCHDOG_USEC", raising=False)
        monkeypatch.delenv("WATCHDOG_PID", raising=False)
        try:
            yield FakeSystemd(sock)
        finally:
            sock.close()


def test_ready_watchdog_stopping_reach_the_socket(systemd: FakeSystemd) -> None:
    assert sdnotify.ready()
    assert sdnotify.watchdog()
    assert sdnotify.stopping()
    assert systemd.messages(timeout_s=2) == ["READY=1", "WATCHDOG=1", "STOPPING=1"]


def test_status_rides_along_on_one_line(systemd: FakeSystemd) -> None:
    assert sdnotify.ready("serving\ngRPC  on 50051")
    assert systemd.messages(timeout_s=2) == ["READY=1\nSTATUS=serving gRPC on 50051"]


def test_abstract_namespace_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"starpulse-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("READY=1")
        assert sock.recv(64) == b"READY=1"


def test_without_notify_socket_everything_is_a_quiet_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready() is False and sdnotify.watchdog() is False and sdnotify.stopping() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")  # a kind this client does not speak
    assert sdnotify.ready() is False


def test_a_dead_socket_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/" + "x" * 200)  # longer than a unix socket path may be
    assert sdnotify.watchdog() is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for bad in ("0", "-5", "soon", ""):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert sdnotify.watchdog_interval_s() is None


def test_watchdog_kicks_at_half_the_interval(systemd: FakeSystemd) -> None:
    dog = sdnotify.Watchdog(interval_s=10.0)
    assert dog.kick(now=100.0)
    assert not dog.kick(now=104.9)
    assert dog.kick(now=105.0)
    assert systemd.messages(timeout_s=2) == ["WATCHDOG=1", "WATCHDOG=1"]
    off = sdnotify.Watchdog()  # no WATCHDOG_USEC: disabled
    assert not off.enabled and not off.kick()


async def test_controller_sends_ready_watchdog_then_stopping(
    systemd: FakeSystemd, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from controller.service import Controller, ControllerConfig

    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # 0.2 s: a ping every 0.1 s of sweeps
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    ctl = Controller(
        ControllerConfig(listen="127.0.0.1:0", http="127.0.0.1:0", db_path=tmp_path / "c.db", sweep_interval_s=0.05),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    try:
        first = systemd.messages(timeout_s=5)
        assert first and first[0].startswith("READY=1\nSTATUS=serving gRPC on port ")
        rest = first[1:]

        def pinged() -> bool:
            rest.extend(systemd.messages())
            return "WATCHDOG=1" in rest

        # A ping comes from the sweep loop: wait for it rather than for a fixed time.
        await wait_for(pinged, what="a watchdog ping from the sweep loop")
    finally:
        await ctl.stop()
    rest += systemd.messages()
    assert "WATCHDOG=1" in rest
    assert rest[-1].startswith("STOPPING=1")
    assert not any(m.startswith("READY=1") for m in rest)


async def test_agent_sends_ready_watchdog_then_stopping(systemd: FakeSystemd, tmp_path: Path) -> None:
    from tests.helpers import free_port, make_sim_agent, wait_for

    sim_agent = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{free_port()}"], interval_s=0.05)
    seen: list[str] = []

    def two_pings() -> bool:
        seen.extend(systemd.messages())
        return seen.count("WATCHDOG=1") >= 2

    sim_agent.start()
    try:
        await wait_for(two_pings, timeout=20, what="two watchdog pings from the agent")
    finally:
        await sim_agent.halt()
    seen.extend(systemd.messages())
    assert seen[0].startswith("READY=1")
    assert seen[-1].startswith("STOPPING=1")
    assert set(m.split("\n")[0] for m in seen) == {"READY=1", "WATCHDOG=1", "STOPPING=1"}
