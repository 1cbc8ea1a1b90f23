"""Issue 32 item 1: a second stream for a node never orphans the first.

Probes, as an attacker on the network (or a second holder of the node's certificate) would try
them, against a real controller on loopback, a real agent on a simulated node and raw gRPC
clients sending hand-made Hellos:

- an imposter says Hello as a node whose agent is streaming: the agent is told (ABORTED),
  comes back by itself and reports again; the takeover is counted as foreign and logged; the
  fight of two live claimants raises an ``agent_conflict`` incident;
- the same Hello replayed with the agent's own buffer epoch but an old stream generation (a
  replay of something seen on the wire): still foreign, and the winner is told it contested a
  live stream;
- an agent's own reconnect while its old stream is half-open (same epoch, higher generation):
  routine, the old stream is ended, nothing is raised;
- the agent speaks through a relay and the imposter directly: the relayed stream is told the
  same way (its relay passes the status on) and the agent comes back through the relay;
- a flood of Hellos for one node from ten clients in turn: each is told when the next takes
  over, the conflict is raised once and updated, the controller serves other nodes throughout;
- a controller that accepts the stream and then never answers (an orphaned stream, a wedged
  handler): the agent notices by its bound on unanswered sends and reconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controller.outputs.web.node import node_json
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, make_relay, make_sim_agent, wait_for

NODE = "node-000"


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            allowed_nodes=[NODE, "node-001"],
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


def _hello(epoch: str, generation: int = 0, node_id: str = NODE) -> spb.AgentMessage:
    return spb.AgentMessage(
        hello=spb.Hello(
            node_id=node_id,
            role=ipb.NODE_ROLE_COMPUTE,
            buffer_epoch=epoch,
            next_event_seq=1,
            stream_generation=generation,
        )
    )


class RawStream:
    """A hand-made agent stream: says Hello, keeps the stream open, records how it ended."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.call: Any = sgrpc.TelemetryStub(self.channel).Connect()
        self.welcome: spb.Welcome | None = None
        self.ended: asyncio.Future[grpc.StatusCode] = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task[None] | None = None

    async def open(self, hello: spb.AgentMessage) -> spb.Welcome:
        await self.call.write(hello)
        first = await self.call.read()
        assert first is not grpc.aio.EOF and first.HasField("welcome"), first
        self.welcome = first.welcome
        self._reader = asyncio.create_task(self._read_rest())
        return first.welcome

    async def _read_rest(self) -> None:
        try:
            while await self.call.read() is not grpc.aio.EOF:
                pass
            self.ended.set_result(await self.call.code())
        except grpc.aio.AioRpcError as err:
            self.ended.set_result(err.code())

    async def close(self) -> None:
        self.call.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.channel.close()


def _registry_of(collector: Any) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def _takeovers(ctl: Controller, kind: str) -> float:
    return ctl.metrics.stream_takeovers.labels(kind)._value.get()


def _latest_seq(ctl: Controller) -> int:
    node = ctl.registry.nodes.get(NODE)
    report = node.latest_report if node is not None else None
    return report.seq if report is not None else 0


async def test_imposter_hello_does_not_silence_the_agent(controller: Controller, tmp_path: Path) -> None:
    """An imposter's Hello ends the agent's stream with ABORTED; the agent reconnects and reports
    again; the takeover is foreign, and the two live claimants raise an agent_conflict incident."""
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=0.2)
    for i in range(3):
        agent.agent.buffer.append(
            tpb.Event(kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, component="host", message=f"e{i}")
        )
    agent.start()
    imposter = RawStream(controller.grpc_port)
    try:
        link = agent.agent.link
        await wait_for(lambda: _latest_seq(controller) >= 2, what="the agent reporting")
        await wait_for(lambda: controller.registry.nodes[NODE].acked_event_seq == 3, what="the agent's events stored")
        welcome = await imposter.open(_hello("imposter-epoch"))
        assert welcome.replaced_live_stream, "the imposter displaced a live stream: the Welcome says so"
        assert welcome.silence_limit_s > 0
        seq_at_takeover = _latest_seq(controller)
        # The real agent was told, came back by itself, and its reports arrive again.
        await wait_for(lambda: link.replaced == 1 and link.connects == 2, what="the agent told and reconnected")
        await wait_for(lambda: _latest_seq(controller) > seq_at_takeover + 2, what="reports after the takeover")
        scraped = generate_latest(_registry_of(agent.agent.metrics_collector())).decode()
        assert f'starpulse_agent_streams_replaced_total{{node="{NODE}"}} 1.0' in scraped  # the node's own /metrics
        assert await asyncio.wait_for(imposter.ended, 10) == grpc.StatusCode.ABORTED  # it lost in turn
        # The imposter's epoch did not cost the agent its place: no event called lost, none twice.
        assert controller.registry.nodes[NODE].acked_event_seq == 3
        assert controller.metrics.lost_events._value.get() == 0
        assert controller.store.count_events(NODE) == 3
        assert _takeovers(controller, "foreign") == 2  # imposter over agent, agent back over imposter
        assert _takeovers(controller, "reconnect") == 0
        assert controller.registry.nodes[NODE].takeovers == 2
        page = node_json(NODE, controller.registry.nodes[NODE], {}, False, controller.clock.time_ms())
        assert page["stream_takeovers"] == 2  # the node page shows it
        await wait_for(
            lambda: any(i.kind == "agent_conflict" for i in controller.detection.correlator.incidents()),
            what="an agent_conflict incident",
        )
        conflict = next(i for i in controller.detection.correlator.incidents() if i.kind == "agent_conflict")
        assert conflict.root_cause == NODE and conflict.severity == "critical"
    finally:
        await imposter.close()
        await agent.halt()


async def test_own_reconnect_over_a_half_open_stream_is_routine(controller: Controller) -> None:
    """Same buffer epoch, higher stream generation: the agent's own reconnect. The old stream is
    ended (ABORTED), nothing is raised, the winner is not told of a contest."""
    first, second = RawStream(controller.grpc_port), RawStream(controller.grpc_port)
    try:
        await first.open(_hello("e1", generation=7))
        welcome = await second.open(_hello("e1", generation=8))
        assert not welcome.replaced_live_stream
        assert await asyncio.wait_for(first.ended, 10) == grpc.StatusCode.ABORTED
        assert _takeovers(controller, "reconnect") == 1
        assert _takeovers(controller, "foreign") == 0
        assert controller.registry.nodes[NODE].takeovers == 0
        assert controller.registry.nodes[NODE].connected
    finally:
        await first.close()
        await second.close()


async def test_replayed_hello_with_an_old_generation_is_foreign(controller: Controller) -> None:
    """The agent's own epoch with a generation that is not newer (a Hello replayed from the wire)
    is a second claimant, not a reconnect: counted foreign, the winner told it contested."""
    first, second = RawStream(controller.grpc_port), RawStream(controller.grpc_port)
    try:
        await first.open(_hello("e1", generation=9))
        welcome = await second.open(_hello("e1", generation=9))
        assert welcome.replaced_live_stream
        assert await asyncio.wait_for(first.ended, 10) == grpc.StatusCode.ABORTED
        assert _takeovers(controller, "foreign") == 1
        # One takeover is a fact to log and count; a conflict needs both claimants back.
        assert not controller.core.conflicts.active(NODE)
    finally:
        await first.close()
        await second.close()


async def test_a_flood_of_hellos_is_seen_and_survived(controller: Controller) -> None:
    streams = [RawStream(controller.grpc_port) for _ in range(10)]
    try:
        for i, stream in enumerate(streams):
            await stream.open(_hello(f"flood-{i}"))
        for stream in streams[:-1]:
            assert await asyncio.wait_for(stream.ended, 10) == grpc.StatusCode.ABORTED
        assert not streams[-1].ended.done()  # the newest holds the node
        assert _takeovers(controller, "foreign") == 9
        assert controller.core.conflicts.active(NODE)
        await wait_for(
            lambda: [i.kind for i in controller.detection.correlator.incidents()].count("agent_conflict") == 1,
            what="one agent_conflict incident, not nine",
        )
        other = RawStream(controller.grpc_port)
        try:
            assert not (await other.open(_hello("e-other", node_id="node-001"))).replaced_live_stream
        finally:
            await other.close()
    finally:
        for stream in streams:
            await stream.close()


async def test_hello_for_another_node_takes_nothing_over(controller: Controller) -> None:
    """Streams of two different nodes live side by side."""
    a, b = RawStream(controller.grpc_port), RawStream(controller.grpc_port)
    try:
        await a.open(_hello("e1"))
        welcome = await b.open(_hello("e2", node_id="node-001"))
        assert not welcome.replaced_live_stream
        await asyncio.sleep(0.2)
        assert not a.ended.done()
        assert _takeovers(controller, "foreign") == _takeovers(controller, "reconnect") == 0
    finally:
        await a.close()
        await b.close()


async def test_relayed_agent_is_told_and_comes_back(controller: Controller, tmp_path: Path) -> None:
    relay_port = free_port()
    relay = make_relay(controller.grpc_port, relay_port)
    await relay.start()
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{relay_port}"], interval_s=0.2)
    agent.start()
    imposter = RawStream(controller.grpc_port)
    try:
        link = agent.agent.link
        await wait_for(lambda: _latest_seq(controller) >= 2, what="the relayed agent reporting")
        await imposter.open(_hello("imposter-epoch"))
        seq_at_takeover = _latest_seq(controller)
        # Generous waits: through the relay the status and the new stream each cross one more hop
        # and its batching, on a machine other tests share.
        await wait_for(lambda: link.replaced >= 1 and link.connects >= 2, 60, "the relayed agent told and back")
        await wait_for(lambda: _latest_seq(controller) > seq_at_takeover + 2, 60, "relayed reports after it")
        assert await asyncio.wait_for(imposter.ended, 10) == grpc.StatusCode.ABORTED
    finally:
        await imposter.close()
        await agent.halt()
        await relay.stop()


class _SilentTelemetry(sgrpc.TelemetryServicer):
    """A controller that welcomes the agent and then answers nothing, ever (an orphaned stream)."""

    def __init__(self, silence_limit_s: float) -> None:
        self.silence_limit_s = silence_limit_s
        self.streams = 0

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.streams += 1
        await context.read()
        await context.write(spb.ControllerMessage(welcome=spb.Welcome(silence_limit_s=self.silence_limit_s)))
        while await context.read() is not grpc.aio.EOF:
            pass  # read and never ack


async def test_agent_leaves_a_stream_the_controller_never_answers(tmp_path: Path) -> None:
    """TCP and keepalive pings are fine, nothing is ever acked: the agent ends the stream itself
    after its silence limit and reconnects through the shared reconnect loop."""
    servicer = _SilentTelemetry(silence_limit_s=0.6)
    server = grpc.aio.server()
    sgrpc.add_TelemetryServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{port}"], interval_s=0.1)
    agent.start()
    try:
        await wait_for(lambda: agent.agent.link.silent_streams >= 1, what="the agent calling the stream dead")
        await wait_for(lambda: servicer.streams >= 2, what="the agent reconnecting")
        assert agent.agent.link.silence_limit_s == pytest.approx(0.6)
    finally:
        await agent.halt()
        await server.stop(None)
