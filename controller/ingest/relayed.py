"""The controller's end of a relay: many agents' streams arriving over one stream, batched.

Why: every gRPC message costs the controller ~0.35 ms of protocol work however small it is
(bench.scale's null controller), which alone is 70 % of a core at 10,000 nodes reporting
every 5 s. A relay (`starpulse relay`, relay/) terminates the agents' streams
near them and forwards their messages in batches, so the controller pays that cost once
per batch instead of once per report, and holds a handful of connections instead of
10,000.

Each relayed agent stream runs through the very same ``TelemetryServicer.serve`` as a
direct stream: a ``RelayedStream`` gives it the ``read/write/abort/peer`` surface of a
``grpc.aio.ServicerContext``. Hello checks, idempotent event storage, acks, commands and
stream rejection therefore behave identically; only the bytes travel differently. Reports
stay undecoded here: the servicer's decider takes their bytes (``RawReport``), and one with
nothing queued before it is handed over as the relay's batch is read (``OpenStream.decide_now``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from controller.ingest.servicer import OpenStream, RawReport, StreamRejected, TelemetryServicer
from controller.metrics import ControllerMetrics, StageCpu
from starpulse.core.tls import peer_node_id
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

_EOF = object()
_REPORT_TAG = 0x12  # AgentMessage field 2 (report), length-delimited: the first byte of a report message
_REPORT_BYTE = bytes([_REPORT_TAG])
# Answers to a relay gather this long: an ack 100 ms later costs an agent nothing (see
# RelayLink.write_loop for what a write costs).
WRITE_LINGER_S = 0.1


class RelayedStreamAborted(Exception):
    """Raised by ``RelayedStream.abort`` as grpc's abort raises: the handler stops there."""


class RelayedStream:
    """One agent's stream as the Telemetry servicer sees it, fed from a relay's batches."""

    def __init__(self, link: RelayLink, stream_id: int, peer: str, identity: str) -> None:
        self._link = link
        self.stream_id = stream_id
        self._peer = peer
        self.identity = identity  # what the relay's mTLS said the agent is ("" without mTLS)
        self._inbox: deque[Any] = deque()
        self._arrived: asyncio.Future[None] | None = None
        self.closed = False  # the controller ended it (a status went to the relay)
        # Set by the servicer while the stream is open (after its Hello): where a report may
        # go as the relay's batch is read, skipping the stream's task (RelayLink.dispatch).
        self.reports: OpenStream | None = None

    # -- fed by the relay link ----------------------------------------------------------
    def feed(self, item: Any) -> None:
        self._inbox.append(item)
        waiter = self._arrived
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def unread_bytes(self) -> int:
        return sum(len(item) for item in self._inbox if type(item) is bytes)

    def reject(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        """End the stream from outside its handler (a report's verdict came back invalid)."""
        dropped = self.unread_bytes()
        self._inbox.clear()  # what is queued behind the invalid report is not read any more
        if dropped:
            self._link.consumed(dropped)
        self.feed(StreamRejected(code, reason, detail))
        self.feed(_EOF)

    # -- the ServicerContext surface TelemetryServicer.serve uses ----------------------
    async def read(self) -> Any:
        while not self._inbox:
            self._arrived = asyncio.get_running_loop().create_future()
            try:
                await self._arrived
            finally:
                self._arrived = None
        item = self._inbox.popleft()
        if item is _EOF:
            self._inbox.appendleft(_EOF)  # every later read sees the end too
            return grpc.aio.EOF
        if type(item) is StreamRejected:
            raise item
        self._link.consumed(len(item))
        if item and item[0] == _REPORT_TAG:
            return RawReport(item)  # the decider decodes it (here, or in a detection shard)
        return spb.AgentMessage.FromString(item)  # DecodeError: the servicer rejects the stream

    async def write(self, message: spb.ControllerMessage) -> None:
        if not self.closed:
            self._link.send(self.stream_id, message=message.SerializeToString())

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.close(code, details)
        raise RelayedStreamAborted(details)

    def close(self, code: grpc.StatusCode, details: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._link.send(self.stream_id, closed=True, status_code=code.value[0], status_detail=details)

    def peer(self) -> str:
        return f"relay:{self._link.relay_id}/{self._peer}"


class RelayLink:
    """One relay's connection: dispatches its batches to relayed streams and batches the answers."""

    def __init__(
        self,
        relay_id: str,
        telemetry: TelemetryServicer,
        context: grpc.aio.ServicerContext,
        max_message_bytes: int,
        max_queued_bytes: int,
        cpu: StageCpu | None = None,
    ) -> None:
        """``cpu``: where a batch's hand-over is charged (``relay_dispatch``: ControllerMetrics.stage_cpu)."""
        self.relay_id = relay_id
        self._cpu = cpu if cpu is not None else StageCpu()
        self._telemetry = telemetry
        self._context = context
        self._max_message_bytes = max_message_bytes
        self._max_queued_bytes = max_queued_bytes
        self.streams: dict[int, RelayedStream] = {}
        self._highest_stream = 0  # relays number streams in the order of their first message
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._outbox = spb.RelayDown()  # filled in place: no per-message object to copy in later
        self._outbox_ready = asyncio.Event()
        self._queued_bytes = 0  # read off the relay's stream, not yet through the servicer
        self._drained = asyncio.Event()
        self._drained.set()

    # -- inbound ------------------------------------------------------------------------
    async def dispatch(self, batch: spb.RelayedAgentBatch) -> None:
        """Hand each message to its stream; wait while too many bytes are queued (backpressure to the relay)."""
        at = time.thread_time()
        for item in batch.messages:
            stream = self.streams.get(item.stream)
            if item.closed:
                if stream is not None:
                    stream.feed(_EOF)
                continue
            if stream is None:
                if item.stream <= self._highest_stream:
                    continue  # in flight when the controller ended that stream: the relay drops it too
                self._highest_stream = item.stream
                stream = self._open(item)
            if stream.closed:
                continue  # the controller already ended it; the relay will drop what follows
            message = item.message
            if len(message) > self._max_message_bytes:
                stream.close(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"message of {len(message)} bytes exceeds {self._max_message_bytes}",
                )
                stream.feed(_EOF)
                continue
            reports = stream.reports
            # A report with nothing queued before it goes to the decider here: no wake-up of
            # the stream's task per report, which costs more than a delta report's detection
            # (the task still handles everything else, in order).
            if (
                reports is not None
                and not stream._inbox
                and message[:1] == _REPORT_BYTE
                and reports.decide_now(message)
            ):
                continue
            self._queued_bytes += len(message)
            stream.feed(message)
        self._cpu.since("relay_dispatch", at)  # with shards: reports handed over; without: decided too
        if self._queued_bytes >= self._max_queued_bytes:
            self._drained.clear()
            await self._drained.wait()
        decider = self._telemetry.decider
        if decider.full:
            await decider.room()  # too many reports wait for verdicts: stop reading this relay a while

    def consumed(self, size: int) -> None:
        self._queued_bytes -= size
        if self._queued_bytes < self._max_queued_bytes // 2:
            self._drained.set()

    def _open(self, item: spb.RelayedAgentMessage) -> RelayedStream:
        stream = RelayedStream(self, item.stream, item.peer, item.identity)
        self.streams[item.stream] = stream
        task = asyncio.create_task(self._telemetry.serve(stream, relayed=stream))
        self._tasks[item.stream] = task
        task.add_done_callback(functools.partial(self._finished, stream))
        return stream

    def _finished(self, stream: RelayedStream, task: asyncio.Task[None]) -> None:
        """The servicer is done with a stream: make sure the relay hears how it ended."""
        self.streams.pop(stream.stream_id, None)
        self._tasks.pop(stream.stream_id, None)
        self._queued_bytes -= stream.unread_bytes()
        if self._queued_bytes < self._max_queued_bytes // 2:
            self._drained.set()
        if task.cancelled():
            stream.close(grpc.StatusCode.CANCELLED, "superseded by a newer stream from the same node")
            return
        exc = task.exception()
        if exc is None or isinstance(exc, RelayedStreamAborted):
            stream.close(grpc.StatusCode.OK, "")
        else:
            log.error("relayed_stream_failed", relay=self.relay_id, stream=stream.stream_id, error=repr(exc))
            stream.close(grpc.StatusCode.INTERNAL, "controller error")

    # -- outbound -----------------------------------------------------------------------
    def send(self, stream: int, **fields: Any) -> None:
        """Queue one RelayedControllerMessage (its fields but the stream's) for the next RelayDown."""
        self._outbox.messages.add(stream=stream, **fields)
        self._outbox_ready.set()

    async def write_loop(self) -> None:
        """Everything written since the last send goes out as one RelayDown.

        A server-side gRPC write costs ~0.1-0.3 ms however small (bench.scale profiles: at
        20 ms, ten relays' writes were ~10 % of the controller's time at 6,000 nodes), so the
        loop lingers after waking: acks and commands for many agents share one.
        """
        while True:
            await self._outbox_ready.wait()
            await asyncio.sleep(WRITE_LINGER_S)
            self._outbox_ready.clear()
            down, self._outbox = self._outbox, spb.RelayDown()
            await self._context.write(down)

    async def close(self) -> None:
        """The relay went away: every relayed stream reads its end (nodes are marked disconnected)."""
        for stream in list(self.streams.values()):
            stream.closed = True  # nothing more can reach that agent
            stream.feed(_EOF)
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=10)


def relayed_or_peer_node_id(context: Any) -> str | None:
    """The node id a stream is authenticated as: the relay's word for a relayed one, else the certificate's.

    A relay is trusted for this only after its own certificate was checked against
    ``ingest.relays`` (RelayServicer.Connect); it verified the agent's certificate itself.
    """
    if isinstance(context, RelayedStream):
        return context.identity or None
    return peer_node_id(context)


class RelayServicer(sgrpc.RelayServicer):
    """Accepts relays; with mTLS only those whose certificate names an allowed relay id."""

    def __init__(
        self,
        telemetry: TelemetryServicer,
        metrics: ControllerMetrics,
        max_message_bytes: int,
        identity_of: Callable[[Any], str | None] | None = None,
        allowed_relays: list[str] | None = None,
        max_queued_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        self.telemetry = telemetry
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        self._identity_of = identity_of
        self._allowed = set(allowed_relays or [])
        # Per relay: while this much is read but not yet processed, the relay's stream is not
        # read, so gRPC flow control holds the rest at the relay (and the relay's at the agents).
        self.max_queued_bytes = max_queued_bytes
        self.links: dict[str, RelayLink] = {}

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("body") != "hello" or not first.hello.relay_id:
            self.metrics.rejected.labels("relay_no_hello").inc()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first relay message must be RelayHello")
            return
        relay_id = first.hello.relay_id
        if self._identity_of is not None:
            identity = self._identity_of(context)
            if identity != relay_id or relay_id not in self._allowed:
                self.metrics.rejected.labels("relay_not_allowed").inc()
                log.warning("relay_refused", relay=relay_id, certificate=identity)
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"certificate names {identity!r}; relay {relay_id!r} is not in ingest.relays",
                )
                return
        link = RelayLink(
            relay_id, self.telemetry, context, self.max_message_bytes, self.max_queued_bytes, self.metrics.stage_cpu
        )
        previous = self.links.get(relay_id)
        self.links[relay_id] = link
        if previous is not None:
            log.warning("relay_reconnected", relay=relay_id)
        log.info("relay_connected", relay=relay_id, peer=context.peer(), version=first.hello.version)
        self.metrics.relays.inc()
        await context.write(spb.RelayDown())  # accepted: the relay may take agents' streams now
        writer = asyncio.create_task(link.write_loop())
        try:
            while True:
                up = await context.read()
                if up is grpc.aio.EOF or writer.done():
                    break
                if up.WhichOneof("body") != "batch":
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "after RelayHello only batches may follow")
                    return
                await link.dispatch(up.batch)
        finally:
            await link.close()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            if self.links.get(relay_id) is link:
                del self.links[relay_id]
            self.metrics.relays.dec()
            log.info("relay_disconnected", relay=relay_id)
