"""A stream whose ack writer fails ends at once with UNAVAILABLE and says why.

The HA leader awaits ``before_ack`` (its flush to etcd) before every ack; when that raises, or an
ack's write does, no ack can go out on the stream any more. It used to be dropped silently: the
stream stayed open without acks, and an agent with events waiting only noticed at its silence
limit. Over real gRPC on loopback, a raw stream says Hello and sends one event, then waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog

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
            allowed_nodes=[NODE],
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


class _FailingFlush:
    """``before_ack`` as a leader whose etcd write fails ``failures`` times, then works."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("etcd: the mirror's write failed")


async def _stream_status(port: int) -> tuple[grpc.StatusCode, str]:
    """Hello, one event, then only reading: how the controller ends the stream."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = sgrpc.TelemetryStub(channel).Connect()
        hello = spb.Hello(node_id=NODE, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e1", next_event_seq=1)
        await call.write(spb.AgentMessage(hello=hello))
        first = await call.read()
        assert first is not grpc.aio.EOF and first.HasField("welcome")
        event = tpb.Event(seq=1, kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, message="x")
        await call.write(spb.AgentMessage(event=event))
        try:
            # Without the fix nothing more comes: the stream stays open, acks never come, and
            # this wait runs out (far below the agent's 30 s silence limit it would otherwise take).
            while await asyncio.wait_for(call.read(), 15) is not grpc.aio.EOF:
                pass
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        finally:
            call.cancel()
        return await call.code(), await call.details()


async def test_a_failed_ack_write_ends_the_stream_with_unavailable(controller: Controller) -> None:
    flush = _FailingFlush(failures=1)
    controller.telemetry.before_ack = flush
    with structlog.testing.capture_logs() as logs:
        code, details = await _stream_status(controller.grpc_port)
    assert flush.calls == 1
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    assert "could not send acks" in details and "etcd: the mirror's write failed" in details, details
    failed = [e for e in logs if e["event"] == "ack_writer_failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == "warning" and failed[0]["node"] == NODE, failed
    assert controller.metrics.rejected.labels("ack_writer_failed")._value.get() == 1
    assert NODE not in controller.telemetry._streams  # the stream is gone, not held open


async def test_the_agent_reconnects_and_its_event_is_acked(controller: Controller, tmp_path: Path) -> None:
    """A real agent whose stream lost its writer reconnects (UNAVAILABLE: the next controller,
    here the same one) and its event is acked on the new stream, without waiting out its
    silence limit. (The raw stream above is what tells the fix apart: this agent's own next
    message also ended the old stream, with OK and nothing said.)"""
    controller.telemetry.before_ack = _FailingFlush(failures=1)
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=60.0)
    agent.agent.buffer.append(
        tpb.Event(kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, component="host", message="e")
    )
    agent.start()
    try:
        link = agent.agent.link
        await wait_for(lambda: link.connects >= 2, what="the agent's second stream")
        await wait_for(lambda: link.acked_event_seq >= 1, what="the event acked on the new stream")
        assert link.silent_streams == 0
    finally:
        await agent.halt()


async def test_a_relayed_stream_is_ended_the_same_way(controller: Controller, tmp_path: Path) -> None:
    """Through a relay the stream's read is woken by the relayed stream's own reject, not a
    cancel. The agent reports once a minute: only the controller ending the stream brings it back
    before its silence limit."""
    controller.telemetry.before_ack = _FailingFlush(failures=1)
    relay_port = free_port()
    relay = make_relay(controller.grpc_port, relay_port)
    await relay.start()
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{relay_port}"], interval_s=60.0)
    agent.agent.buffer.append(
        tpb.Event(kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, component="host", message="e")
    )
    with structlog.testing.capture_logs() as logs:
        agent.start()
        try:
            link = agent.agent.link
            await wait_for(lambda: link.connects >= 2, what="the relayed agent's second stream")
            await wait_for(lambda: link.acked_event_seq >= 1, what="the event acked on the new stream")
            assert link.silent_streams == 0
        finally:
            await agent.halt()
            await relay.stop()
    assert [e["node"] for e in logs if e["event"] == "ack_writer_failed"] == [NODE]
