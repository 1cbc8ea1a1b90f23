"""Shared test helpers: free ports, waiting on conditions, simulated agents on loopback."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.factory import build_agent
from agent.runtime import Agent, AgentConfig
from agent.sim.node import SimNode

if TYPE_CHECKING:
    from controller.relay.service import Relay


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    )
    agent.link.backoff.initial_s = 0.1
    agent.link.backoff.max_s = 0.5
    return SimAgent(sim=sim, agent=agent, stop=asyncio.Event())


async def stream_session(channel: Any, *messages: Any) -> Any:
    """Send AgentMessages on one Telemetry stream while reading; return the status it ended with.

    Reading concurrently matters: a server that ends the call mid-write must be seen by its
    status, not by the client's failed write.
    """
    import grpc

    from starpulse.v1 import service_pb2_grpc as sgrpc

    async with channel as ch:
        call = sgrpc.TelemetryStub(ch).Connect()

        async def read_all() -> grpc.StatusCode:
            try:
                while await call.read() is not grpc.aio.EOF:
                    pass
            except grpc.aio.AioRpcError as err:
                return err.code()
            return await call.code()

        reader = asyncio.create_task(read_all())
        try:
            for m in messages:
                await call.write(m)
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the server ended the call mid-write: the status the reader saw is what counts
        return await asyncio.wait_for(reader, 20)


def make_relay(controller_port: int, port: int, relay_id: str = "relay-a") -> Relay:
    """Build (not start) a relay to a controller on loopback, with short reconnect backoff."""
    from controller.relay.service import Relay, RelayConfig

    relay = Relay(
        RelayConfig(controllers=[f"127.0.0.1:{controller_port}"], relay_id=relay_id, listen=f"127.0.0.1:{port}",
                    linger_s=0.01, metrics_listen="127.0.0.1:0")
    )
    relay.upstream.backoff.initial_s = 0.1
    relay.upstream.backoff.max_s = 0.3
    return relay


async def halt_agents(agents: list[SimAgent]) -> None:
    """Stop sim agents started by a test (each waits for its own shutdown)."""
    for a in agents:
        await a.halt()
