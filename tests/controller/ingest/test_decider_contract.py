"""Both report deciders keep ingest's contract (controller.ingest.decider), on both ways in.

Ingest must not be able to tell who decided a report: detection on the controller's event
loop (``Detection``, no workers) or a detection shard process (``DetectShards``, one
worker), reached by a direct agent stream (``decide``) or a relayed one (``decide_raw``,
taken as the relay's batch is read). Each case runs a real controller as the service
wires it and talks to it over loopback gRPC, as an agent or as a relay would.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.detect.pipeline import DetectionConfig
from controller.ingest.registry import NodeRecord
from controller.ingest.verdict import ReportResult
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, wait_for

NODE = "node-007"
READ_TIMEOUT_S = 15.0


@dataclass
class Ended:
    """The controller ended the agent's stream with this status."""

    code: grpc.StatusCode
    detail: str


@dataclass
class Heard:
    """A registry listener: every decided report, as its one hook saw it."""

    verdicts: list[tuple[str, ReportResult]] = field(default_factory=list)

    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        self.verdicts.append((node.node_id, verdict))

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        return None

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        return None


class DirectAgent:
    """One agent stream straight to the controller's Telemetry service."""

    def __init__(self, port: int) -> None:
        self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self._call: Any = sgrpc.TelemetryStub(self._channel).Connect()

    async def open(self) -> None:
        return None

    async def send(self, message: spb.AgentMessage) -> None:
        await self._call.write(message)

    async def next(self) -> spb.ControllerMessage | Ended:
        try:
            msg = await asyncio.wait_for(self._call.read(), READ_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return Ended(exc.code(), exc.details() or "")
        if msg is grpc.aio.EOF:
            return Ended(grpc.StatusCode.OK, "")
        return msg

    async def close(self) -> None:
        await self._channel.close()


class RelayedAgent:
    """One agent stream carried by a relay: this test speaks the relay's side of Relay.Connect."""

    STREAM = 1

    def __init__(self, port: int) -> None:
        self._channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self._call: Any = sgrpc.RelayStub(self._channel).Connect()
        self._answers: list[spb.RelayedControllerMessage] = []

    async def open(self) -> None:
        await self._call.write(spb.RelayUp(hello=spb.RelayHello(relay_id="relay-1", version="test")))
        await asyncio.wait_for(self._call.read(), READ_TIMEOUT_S)  # accepted: an empty RelayDown

    async def send(self, message: spb.AgentMessage) -> None:
        item = spb.RelayedAgentMessage(stream=self.STREAM, message=message.SerializeToString(), peer="test")
        await self._call.write(spb.RelayUp(batch=spb.RelayedAgentBatch(messages=[item])))

    async def next(self) -> spb.ControllerMessage | Ended:
        while not self._answers:
            down = await asyncio.wait_for(self._call.read(), READ_TIMEOUT_S)
            assert down is not grpc.aio.EOF, "the controller ended the relay's stream"
            self._answers.extend(m for m in down.messages if m.stream == self.STREAM)
        answer = self._answers.pop(0)
        if answer.closed:
            return Ended(_status(answer.status_code), answer.status_detail)
        return spb.ControllerMessage.FromString(answer.message)

    async def close(self) -> None:
        await self._channel.close()


def _status(code: int) -> grpc.StatusCode:
    return next(s for s in grpc.StatusCode if s.value[0] == code)


@dataclass
class Rig:
    controller: Controller
    agent: DirectAgent | RelayedAgent
    heard: Heard

    async def hello(self) -> None:
        await self.agent.open()
        hello = spb.Hello(node_id=NODE, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e", next_event_seq=1)
        hello.inventory.gpus.add(index=0, uuid="GPU-0")
        await self.agent.send(spb.AgentMessage(hello=hello))
        first = await self.agent.next()
        assert isinstance(first, spb.ControllerMessage) and first.HasField("welcome")

    async def report(self, report: tpb.Report) -> None:
        await self.agent.send(spb.AgentMessage(report=report))

    async def ack(self) -> spb.Ack:
        """The next ack (commands and other answers skipped)."""
        while True:
            msg = await self.agent.next()
            assert isinstance(msg, spb.ControllerMessage), f"the stream ended: {msg}"
            if msg.HasField("ack"):
                return msg.ack

    async def ack_for(self, seq: int) -> spb.Ack:
        while (ack := await self.ack()).report_seq < seq:
            pass
        return ack

    def node(self) -> NodeRecord:
        return self.controller.registry.nodes[NODE]


@pytest.fixture(params=[0, 1], ids=["in-process", "sharded"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture(params=["direct", "relayed"])
async def rig(tmp_path: Path, workers: int, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            report_ack_interval_s=0.0,  # every verdict acked: the contract, not the spacing
            detection=DetectionConfig(workers=workers),
        ),
        clock=SYSTEM_CLOCK,
    )
    heard = Heard()
    ctl.registry.listeners.append(heard)
    await ctl.start()
    agent = DirectAgent(ctl.grpc_port) if request.param == "direct" else RelayedAgent(ctl.grpc_port)
    try:
        yield Rig(ctl, agent, heard)
    finally:
        await agent.close()
        await ctl.stop()


def _report(seq: int, *, delta: bool = False, temperature_c: float = 40.0) -> tpb.Report:
    report = tpb.Report(seq=seq, timestamp_ms=int(time.time() * 1000), counters_delta=delta)
    report.gpus.add(index=0, temperature_c=temperature_c, sm_clock_mhz=1980, power_w=400.0, utilization_gpu_pct=90)
    return report


async def test_a_valid_report_is_recorded_and_acked(rig: Rig) -> None:
    """Presence, ack position, LLDP, job steps and fail-slow signals: recorded whoever decided."""
    await rig.hello()
    report = _report(1)
    report.lldp.neighbors.add(local_interface="eth0", chassis_name="leaf-a", port_id="Ethernet4")
    report.job_steps.add(job="llm", rank=0, step=10, world_size=1, pid=4242)
    await rig.report(report)

    ack = await rig.ack_for(1)

    assert ack.report_seq == 1 and not ack.full_report_needed
    node = rig.node()
    assert node.acked_report_seq == 1 and node.state == "online"
    assert [(n.chassis_name, n.port_id) for n in node.lldp] == [("leaf-a", "Ethernet4")]
    assert rig.controller.jobs.jobs_of(NODE) == ["llm"]
    assert rig.controller.metrics.reports._value.get() == 1
    [(_, verdict)] = rig.heard.verdicts
    assert verdict.seq == 1 and verdict.gpus == 1 and not verdict.error
    assert verdict.signals, "the first report of a node is a fail-slow sample"


async def test_an_invalid_report_ends_the_stream_invalid_argument(rig: Rig) -> None:
    """Refused where it is decided (here or in the shard), the stream still ends with the reason."""
    await rig.hello()
    await rig.report(_report(1))
    await rig.ack_for(1)
    await rig.report(_report(2, temperature_c=math.nan))

    while isinstance(end := await rig.agent.next(), spb.ControllerMessage):
        pass

    assert end.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature_c" in end.detail
    assert rig.controller.metrics.rejected.labels("invalid_message")._value.get() == 1
    await wait_for(lambda: not rig.node().connected, what="the stream closed")
    assert rig.node().acked_report_seq == 1  # nothing of the invalid report was taken
    assert [v.seq for _, v in rig.heard.verdicts] == [1]


async def test_a_delta_before_any_full_report_asks_for_one(rig: Rig) -> None:
    """The delta is still used; its ack asks for a full report, and once one came, no more."""
    await rig.hello()
    await rig.report(_report(1, delta=True))

    ack = await rig.ack_for(1)

    assert ack.full_report_needed and ack.report_seq == 1
    assert rig.node().acked_report_seq == 1
    await rig.report(_report(2))
    await rig.report(_report(3, delta=True))
    ack = await rig.ack_for(3)
    assert not ack.full_report_needed


async def test_each_report_reaches_the_listeners_once(rig: Rig) -> None:
    """One hook per report, whatever decided it, in the order the agent sent them; events are not reports."""
    await rig.hello()
    for seq in range(1, 7):
        await rig.report(_report(seq, delta=seq % 3 != 1))
        if seq == 3:
            event = tpb.Event(seq=1, kind=tpb.EVENT_KIND_XID, severity=tpb.SEVERITY_CRITICAL, component="gpu-0", xid=79)
            await rig.agent.send(spb.AgentMessage(event=event))

    await rig.ack_for(6)

    await wait_for(lambda: len(rig.heard.verdicts) >= 6, what="every verdict heard")
    await asyncio.sleep(0.2)  # nothing heard twice arrives late
    assert [(n, v.seq) for n, v in rig.heard.verdicts] == [(NODE, seq) for seq in range(1, 7)]
    assert rig.controller.metrics.reports._value.get() == 6
    assert rig.node().acked_event_seq == 1
