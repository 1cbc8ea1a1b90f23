"""RelayLink: relayed streams fed from batches, bounded by bytes, ended with a status the relay hears."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from controller.ingest.relayed import RelayedStream, RelayLink
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import wait_for


class NeverFull:
    """A report decider with nothing waiting for verdicts: the link never holds the relay for it."""

    full = False


class GatedServicer:
    """Reads its stream only while the gate is open; records what it read."""

    decider = NeverFull()

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.read: list[Any] = []

    async def serve(self, context: RelayedStream, relayed: RelayedStream | None = None) -> None:
        while True:
            await self.gate.wait()
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            self.read.append(msg)
            if msg.WhichOneof("body") == "command_result" and msg.command_result.id == "reject":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rejected")


class Sink:
    def __init__(self) -> None:
        self.written: list[spb.RelayDown] = []

    async def write(self, down: spb.RelayDown) -> None:
        self.written.append(down)


def _batch(stream: int, n: int, size: int = 1000) -> spb.RelayedAgentBatch:
    msg = spb.AgentMessage(command_result=spb.CommandResult(id="x", message="p" * size)).SerializeToString()
    return spb.RelayedAgentBatch(messages=[spb.RelayedAgentMessage(stream=stream, message=msg) for _ in range(n)])


async def test_reading_the_relay_waits_while_too_many_bytes_are_queued() -> None:
    servicer = GatedServicer()
    link = RelayLink("r", servicer, Sink(), max_message_bytes=1 << 20, max_queued_bytes=8_000)  # type: ignore[arg-type]
    dispatch = asyncio.create_task(link.dispatch(_batch(1, 10)))  # ~10 kB > 8 kB
    await asyncio.sleep(0.05)
    assert not dispatch.done(), "dispatch must hold the relay's stream while the servicer lags"
    servicer.gate.set()
    await asyncio.wait_for(dispatch, 5)
    # The servicer reads on in its own task: wait for it, not for a fixed time (a starved loop
    # fires a 50 ms timer after only a few of the reads).
    await wait_for(lambda: len(servicer.read) >= 10, what="the servicer to read the batch")
    assert len(servicer.read) == 10  # nothing dropped, in order
    await link.close()


async def test_a_rejected_stream_is_closed_with_its_status_and_the_rest_dropped() -> None:
    servicer = GatedServicer()
    servicer.gate.set()
    sink = Sink()
    link = RelayLink("r", servicer, sink, max_message_bytes=1 << 20, max_queued_bytes=1 << 20)  # type: ignore[arg-type]
    writer = asyncio.create_task(link.write_loop())
    reject = spb.AgentMessage(command_result=spb.CommandResult(id="reject")).SerializeToString()
    await link.dispatch(spb.RelayedAgentBatch(messages=[spb.RelayedAgentMessage(stream=7, message=reject)]))
    for _ in range(100):
        closed = [m for d in sink.written for m in d.messages if m.closed]
        if closed:
            break
        await asyncio.sleep(0.01)
    assert [(m.stream, m.status_code, m.status_detail) for m in closed] == [
        (7, grpc.StatusCode.INVALID_ARGUMENT.value[0], "rejected")
    ]
    await wait_for(lambda: 7 not in link.streams, what="the rejected stream to be forgotten")
    await link.dispatch(_batch(7, 3))  # the relay had more in flight for it: not read, not queued
    assert link.streams == {} and link._queued_bytes == 0
    writer.cancel()
    await link.close()


async def test_an_oversize_relayed_message_ends_only_its_stream() -> None:
    servicer = GatedServicer()
    servicer.gate.set()
    sink = Sink()
    link = RelayLink("r", servicer, sink, max_message_bytes=500, max_queued_bytes=1 << 20)  # type: ignore[arg-type]
    writer = asyncio.create_task(link.write_loop())
    await link.dispatch(_batch(1, 1, size=2000))
    await link.dispatch(_batch(2, 2, size=100))
    for _ in range(100):
        if len(servicer.read) == 2 and any(m.closed for d in sink.written for m in d.messages):
            break
        await asyncio.sleep(0.01)
    closed = [m for d in sink.written for m in d.messages if m.closed]
    assert [(m.stream, m.status_code) for m in closed] == [(1, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])]
    assert len(servicer.read) == 2  # stream 2 unaffected
    writer.cancel()
    await link.close()


class TakesReports:
    """Stands in for the servicer's OpenStream: takes every report handed to it as the batch is read."""

    def __init__(self) -> None:
        self.taken: list[bytes] = []

    def decide_now(self, agent_message: bytes) -> bool:
        self.taken.append(agent_message)
        return True


async def test_a_report_with_nothing_queued_before_it_is_handed_over_as_the_batch_is_read() -> None:
    """The stream's task is not woken for it; a report queued behind another message waits its turn."""
    servicer = GatedServicer()  # gate closed: the stream's task reads nothing
    link = RelayLink("r", servicer, Sink(), max_message_bytes=1 << 20, max_queued_bytes=1 << 20)  # type: ignore[arg-type]
    first = spb.AgentMessage(command_result=spb.CommandResult(id="first")).SerializeToString()
    await link.dispatch(spb.RelayedAgentBatch(messages=[spb.RelayedAgentMessage(stream=1, message=first)]))
    stream = link.streams[1]
    stream._inbox.clear()  # as if the stream's task had read it
    link.consumed(len(first))
    reports = TakesReports()
    stream.reports = reports  # type: ignore[assignment]
    report = spb.AgentMessage(report=tpb.Report(seq=1)).SerializeToString()
    command = spb.AgentMessage(command_result=spb.CommandResult(id="c")).SerializeToString()
    batch = [spb.RelayedAgentMessage(stream=1, message=m) for m in (report, command, report)]

    await link.dispatch(spb.RelayedAgentBatch(messages=batch))

    assert reports.taken == [report]  # the first: nothing before it
    assert list(stream._inbox) == [command, report]  # the second waits behind the command, in order
    stream.reports = None
    servicer.gate.set()  # the stream's task reads to its end
    await link.close()
