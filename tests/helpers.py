"""Shared test helpers: recorded fixtures, free ports, waiting on conditions, simulated agents on loopback."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.factory import build_agent
from agent.probe.prober import Prober
from agent.runtime import Agent, AgentConfig
from agent.sim.node import SimNode

if TYPE_CHECKING:
    from relay.service import Relay


SHARED_FIXTURES_ENV = "STARPULSE_SHARED_FIXTURES"


def shared_fixtures_dir() -> Path:
    """Where the recorded real outputs live: ``../shared/fixtures`` beside the repository root.

    ``$STARPULSE_SHARED_FIXTURES`` overrides it (a missing folder there is how a run proves
    that a clone without ``../shared`` still passes, the recorded cases skipped).
    """
    override = os.environ.get(SHARED_FIXTURES_ENV)
    if override:
        return Path(override)
    return (Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures").resolve()


def shared_fixture(relative: str) -> Path:
    """A recorded real output, read in place (never copied into the project); skips the test without one.

    Recorded files keep their origin and licence where they are provided, so a clone may not
    have them: the calling test is skipped, naming the folder, and the same behaviour is also
    tested on generated fixtures. With the folder present, a missing entry is a failure, not a
    skip, so a mistyped name cannot turn a test off.
    """
    root = shared_fixtures_dir()
    if not root.is_dir():
        where = f"${SHARED_FIXTURES_ENV}" if os.environ.get(SHARED_FIXTURES_ENV) else "../shared/fixtures"
        pytest.skip(f"recorded fixture {relative} needs {root} ({where}), which is absent here")
    path = root / relative
    if not path.exists():
        pytest.fail(f"recorded fixture {relative} is not in {root}")
    return path


_handed_out: set[int] = set()
_rng = random.Random()  # not seeded from tests: each process draws its own ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # also fails when something holds it on loopback only
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nothing listens on, from below the kernel's ephemeral range.

    A port the kernel handed out for bind(0) is itself ephemeral: between this call and the
    server binding it, any outgoing connection (a gRPC client, etcd's own peers) may get it
    as its local port, and the server then fails with "address already in use" (seen in CI).
    The kernel never picks a local port outside the ephemeral range, so one from below it
    can only be taken by another listener; a port is not handed out twice in one process.
    """
    low, _ = _ephemeral_range()
    if low > 12_000:
        for _ in range(200):
            port = _rng.randrange(10_000, low)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket() as s:  # no room below the range: the kernel's pick, as before
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """n distinct free ports (free_port n times)."""
    return [free_port() for _ in range(n)]


async def wait_for(cond: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:  # noqa: ASYNC109
    """Poll cond until true; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class SimAgent:
    """A real Agent on a simulated node, running as a task in the test's loop."""

    sim: SimNode
    agent: Agent
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.agent.run(self.stop))

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await self.task


def make_sim_agent(
    node_id: str,
    workdir: Path,
    controllers: list[str],
    interval_s: float = 0.3,
    sim: SimNode | None = None,
    seed: int = 0,
    prober: Prober | None = None,
) -> SimAgent:
    """Build (not start) an agent whose collectors read a simulated node under workdir."""
    sim = sim or SimNode(node_id, workdir / node_id / "hw", seed=seed)
    agent = build_agent(
        AgentConfig(
            node_id=node_id,
            controllers=controllers,
            interval_s=interval_s,
            buffer_path=str(workdir / node_id / "buffer.db"),
        ),
        "sim",
        sim=sim,
        prober=prober,
    )
    agent.link.backoff.initial_s = 0.1
    agent.link.backoff.max_s = 0.5
    return SimAgent(sim=sim, agent=agent, stop=asyncio.Event())


async def stream_session(channel: Any, *messages: Any) -> Any:
    """Send AgentMessages on one Telemetry stream while reading; return the status it ended with.

    Reading concurrently matters: a server that ends the call mid-write must be seen by its
    status, not by the client's failed write. As the agent does, the messages after the first
    (the Hello) wait for the server's first answer: a write racing a rejection makes gRPC's
    client core end the call as INTERNAL ("Internal error from Core"), hiding the server's code.
    """
    import grpc

    from starpulse.v1 import service_pb2_grpc as sgrpc

    async with channel as ch:
        call = sgrpc.TelemetryStub(ch).Connect()
        answered = asyncio.Event()

        async def read_all() -> grpc.StatusCode:
            try:
                while await call.read() is not grpc.aio.EOF:
                    answered.set()
            except grpc.aio.AioRpcError as err:
                return err.code()
            return await call.code()

        reader = asyncio.create_task(read_all())
        try:
            for i, m in enumerate(messages):
                if i == 1:
                    waiter = asyncio.create_task(answered.wait())
                    await asyncio.wait({reader, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if reader.done():
                        break  # rejected before any answer: the rest would only race the status
                await call.write(m)
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the server ended the call mid-write: the status the reader saw is what counts
        return await asyncio.wait_for(reader, 20)


def make_relay(controller_port: int, port: int, relay_id: str = "relay-a") -> Relay:
    """Build (not start) a relay to a controller on loopback, with short reconnect backoff."""
    from relay.service import Relay, RelayConfig

    relay = Relay(
        RelayConfig(
            controllers=[f"127.0.0.1:{controller_port}"],
            relay_id=relay_id,
            listen=f"127.0.0.1:{port}",
            linger_s=0.01,
            metrics_listen="127.0.0.1:0",
        )
    )
    relay.upstream.backoff.initial_s = 0.1
    relay.upstream.backoff.max_s = 0.3
    return relay


async def halt_agents(agents: list[SimAgent]) -> None:
    """Stop sim agents started by a test (each waits for its own shutdown)."""
    for a in agents:
        await a.halt()
