"""The gRPC servicer agents stream into.

Per stream: Hello first (validated, node known), then reports and events, each checked
before it reaches the store. Anything wrong ends that stream with a status that says
what was wrong; the controller itself never goes down for a bad message.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.ingest.ratelimit import TokenBucket
from controller.ingest.registry import NodeRecord, NodeRegistry, UnknownNode
from controller.ingest.validate import InvalidMessage, validate_event, validate_hello, validate_report
from controller.metrics import ControllerMetrics
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb

if TYPE_CHECKING:
    from controller.ingest.verdict import ReportResult

log = structlog.get_logger(__name__)

_COMPUTE = ipb.NODE_ROLE_COMPUTE
SHARD_DRAIN_TIMEOUT_S = 10.0  # an ending stream waits this long for its reports' verdicts


class ShardedDecider(Protocol):
    """Detection in other processes: reports go over as bytes, each ``ReportResult`` comes back later."""

    def submit_report(self, node: NodeRecord, agent_message: bytes, validated: bool) -> None: ...

    async def room(self) -> None:
        """Wait while too many reports are with the deciders."""


class RawReport:
    """A relayed AgentMessage holding a report, not decoded: it goes to a detection shard as it is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


@dataclass
class _ShardedStream:
    """What a stream needs when its reports are decided in a detection shard, after its read loop moved on."""

    token: int
    ack_needed: asyncio.Event
    reject: Callable[[grpc.StatusCode, str, str], None] | None  # wakes a relayed stream's read to end it
    acked_at: float = -math.inf
    pending: int = 0  # reports handed to a shard, not decided yet
    drained: asyncio.Event | None = None  # set when pending reaches 0 (the stream is ending)
    rejected: StreamRejected | None = None  # a shard found a report invalid: the stream ends with this

    def hand_over(self, shards: ShardedDecider, node: NodeRecord, agent_message: bytes, validated: bool) -> None:
        """One report to its shard, counted until its verdict comes back (on_shard_result)."""
        self.pending += 1
        shards.submit_report(node, agent_message, validated)


@dataclass
class _ReportState:
    """Per stream, what deciding its reports carries from one to the next (the loop and the fast path share it)."""

    ack_needed: asyncio.Event
    full_seen: bool = False  # a delta report needs a full one before it on the same stream
    acked_at: float = -math.inf  # when a report last woke the ack writer (monotonic)


class StreamRejected(Exception):
    """Ends one agent stream with a status; raised inside the stream, turned into abort() outside."""

    def __init__(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.reason = reason
        self.detail = detail


class TelemetryServicer(sgrpc.TelemetryServicer):
    def __init__(
        self,
        registry: NodeRegistry,
        metrics: ControllerMetrics,
        rate_per_s: float = 200.0,
        burst: float = 5000.0,
        report_interval_s: float = 0.0,
        controller_id: str = "",
        identity_of: Any = None,
        report_ack_interval_s: float = 0.0,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.report_interval_s = report_interval_s
        self.controller_id = controller_id
        self.report_ack_interval_s = report_ack_interval_s
        # identity_of(context) -> node id the peer's certificate names, or None (no mTLS).
        self._identity_of = identity_of
        self._active: dict[str, asyncio.Task[Any]] = {}
        # Detection shards (controller.detect.shards), when the controller runs them: compute
        # nodes' reports are decided there and acked when their result comes back.
        self.shards: ShardedDecider | None = None
        self._sharded: dict[str, _ShardedStream] = {}
        # Awaited before every ack (HA: the events must be in etcd before the agent may forget them).
        self.before_ack: Callable[[], Awaitable[Any]] | None = None

    async def _reject(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str, detail: str) -> None:
        self.metrics.rejected.labels(reason).inc()
        log.warning("agent_message_rejected", reason=reason, detail=detail, peer=context.peer())
        await context.abort(code, detail)

    async def _read(self, context: grpc.aio.ServicerContext) -> Any:
        """The next agent message; a malformed one ends the stream with INVALID_ARGUMENT."""
        try:
            return await context.read()
        except DecodeError as exc:
            raise StreamRejected(
                grpc.StatusCode.INVALID_ARGUMENT, "malformed", f"message is not an AgentMessage: {exc}"
            ) from None

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            first = await self._read(context)
        except StreamRejected as bad:
            await self._reject(context, bad.code, bad.reason, bad.detail)
            return
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("body") != "hello":
            await self._reject(
                context, grpc.StatusCode.FAILED_PRECONDITION, "no_hello", "the first message must be Hello"
            )
            return
        hello = first.hello
        try:
            validate_hello(hello)
        except InvalidMessage as exc:
            await self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_hello", str(exc))
            return
        if self._identity_of is not None:
            identity = self._identity_of(context)
            if identity != hello.node_id:
                await self._reject(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    "identity_mismatch",
                    f"certificate names {identity!r}, hello claims {hello.node_id!r}",
                )
                return
        try:
            node = self.registry.register(hello)
        except UnknownNode as exc:
            await self._reject(context, grpc.StatusCode.NOT_FOUND, "unknown_node", str(exc))
            return
        token = node.stream_token
        previous = self._active.get(node.node_id)
        if previous is not None and not previous.done():
            # A reconnect while the old stream is half-open: the new one wins.
            previous.cancel()
        me = asyncio.current_task()
        assert me is not None
        self._active[node.node_id] = me
        await context.write(
            spb.ControllerMessage(
                welcome=spb.Welcome(
                    acked_event_seq=node.acked_event_seq,
                    acked_report_seq=node.acked_report_seq,
                    report_interval_s=self.report_interval_s,
                    controller_id=self.controller_id,
                    accepts_delta_reports=True,
                )
            )
        )
        self.metrics.streams.inc()
        log.info("agent_stream_open", node=node.node_id, acked_event_seq=node.acked_event_seq)
        ack_needed = asyncio.Event()
        writer = asyncio.create_task(self._write_loop(context, node, ack_needed))
        if self.shards is not None:
            self._sharded[node.node_id] = _ShardedStream(token, ack_needed, getattr(context, "reject", None))
        rejected: StreamRejected | None = None
        try:
            await self._read_loop(context, node, ack_needed, writer)
        except StreamRejected as exc:
            rejected = exc
        finally:
            # Stop writing before the status goes out: a write racing the abort is a core error.
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self.metrics.streams.dec()
            self.registry.disconnected(node, token)
            if self._active.get(node.node_id) is me:
                del self._active[node.node_id]
            sharded = self._sharded.get(node.node_id)
            if sharded is not None and sharded.token == token:
                del self._sharded[node.node_id]
            log.info("agent_stream_closed", node=node.node_id)
        if rejected is not None:
            await self._reject(context, rejected.code, rejected.reason, rejected.detail)

    async def _read_loop(
        self,
        context: grpc.aio.ServicerContext,
        node: NodeRecord,
        ack_needed: asyncio.Event,
        writer: asyncio.Task[None],
    ) -> None:
        bucket = TokenBucket(self.rate_per_s, self.burst)
        shards = self.shards
        sharded = self._sharded.get(node.node_id) if shards is not None and node.role == _COMPUTE else None
        reports = _ReportState(ack_needed)
        relayed = hasattr(context, "fast_report")
        if relayed and sharded is not None and shards is not None:

            def to_shard(raw: bytes) -> bool:
                """A relayed report straight to its shard, as the loop below would hand it over."""
                if sharded.rejected is not None or writer.done() or not bucket.take():
                    return False  # let the loop read it: it ends the stream or rate-limits it
                sharded.hand_over(shards, node, raw, validated=False)
                return True

            context.fast_report = to_shard
        elif relayed and shards is None:

            def decide_now(raw: bytes) -> bool:
                """A relayed report decided as the relay's batch is read, without waking this stream's task.

                Anything but a valid report in order (undecodable, invalid, over the rate, the
                writer gone) is left to the loop below, which reads it again and ends the stream.
                """
                if writer.done() or not bucket.take():
                    return False
                started = time.perf_counter()
                try:
                    report = spb.AgentMessage.FromString(raw).report
                    validate_report(report)
                except (DecodeError, InvalidMessage):
                    return False
                self._decide_report(node, report, reports, started)
                return True

            context.fast_report = decide_now
        try:
            await self._read_messages(context, node, writer, bucket, sharded, reports)
        finally:
            if relayed:
                context.fast_report = None

    async def _read_messages(
        self,
        context: grpc.aio.ServicerContext,
        node: NodeRecord,
        writer: asyncio.Task[None],
        bucket: TokenBucket,
        sharded: _ShardedStream | None,
        reports: _ReportState,
    ) -> None:
        shards = self.shards
        ack_needed = reports.ack_needed
        while True:
            msg = await self._read(context)
            if sharded is not None and sharded.rejected is not None:
                raise sharded.rejected
            if msg is grpc.aio.EOF:
                if sharded is not None:
                    await self._drain(node, sharded)
                return
            if writer.done():
                return
            if not bucket.take():
                raise StreamRejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "rate_limited",
                    f"node {node.node_id} exceeds {self.rate_per_s:g} messages/s",
                )
            if type(msg) is RawReport:
                if sharded is not None and shards is not None:
                    sharded.hand_over(shards, node, msg.data, validated=False)  # decoded and checked there
                    await shards.room()
                    continue
                try:
                    msg = spb.AgentMessage.FromString(msg.data)
                except DecodeError as exc:
                    raise StreamRejected(
                        grpc.StatusCode.INVALID_ARGUMENT, "malformed", f"message is not an AgentMessage: {exc}"
                    ) from None
            started = time.perf_counter()
            which = msg.WhichOneof("body")
            try:
                if which == "report":
                    report = msg.report
                    validate_report(report)
                    if sharded is not None and shards is not None:
                        sharded.hand_over(shards, node, msg.SerializeToString(), validated=True)
                        await shards.room()
                    else:
                        self._decide_report(node, report, reports, started)
                    continue
                if which == "event":
                    validate_event(msg.event)
                    self.registry.record_events(node, [msg.event])
                elif which == "command_result":
                    self.registry.touch(node)
                    log.info(
                        "command_result",
                        node=node.node_id,
                        id=msg.command_result.id,
                        ok=msg.command_result.ok,
                        message=msg.command_result.message,
                    )
                else:
                    raise InvalidMessage(f"unexpected message {which!r} after Hello")
            except InvalidMessage as exc:
                raise StreamRejected(grpc.StatusCode.INVALID_ARGUMENT, "invalid_message", str(exc)) from None
            self.metrics.ingest_seconds.observe(time.perf_counter() - started)
            ack_needed.set()

    def _decide_report(self, node: NodeRecord, report: tpb.Report, state: _ReportState, started: float) -> None:
        """Record a valid report (detection runs as its listener) and wake the ack writer when one is due."""
        if not report.counters_delta:
            state.full_seen = True
        elif not state.full_seen:
            node.full_report_needed = True  # still used: absent counters read as unchanged
        self.registry.record_report(node, report)
        self._decided(node, started, report.timestamp_ms, state)

    def _decided(
        self, node: NodeRecord, started: float, stamp_ms: int, stream: _ReportState | _ShardedStream | None
    ) -> None:
        """A report's decision is in (here or in a shard): the decision histograms, then its ack when due."""
        self.metrics.ingest_seconds.observe(time.perf_counter() - started)
        if stamp_ms:
            self.metrics.report_age_seconds.observe(max(0.0, time.time() - stamp_ms / 1000))
        if stream is None:
            return
        if not node.full_report_needed:
            # Reports are state, not history: ack them at most every report_ack_interval_s
            # (an ack is one of the dearest things a stream does); everything else at once.
            now = time.monotonic()
            if now - stream.acked_at < self.report_ack_interval_s:
                return
            stream.acked_at = now
        stream.ack_needed.set()

    def on_shard_result(self, result: ReportResult) -> None:
        """A detection shard decided a report: record it, and ack it (or end an invalid stream)."""
        node = self.registry.nodes.get(result.node_id)
        if node is None:
            return
        stream = self._sharded.get(result.node_id)
        if stream is not None and stream.token != result.stream_token:
            stream = None  # from a stream that has ended since: record it, answer nobody
        if stream is not None:
            stream.pending -= 1
            if stream.pending <= 0 and stream.drained is not None:
                stream.drained.set()
        if result.error:
            if stream is None:
                self.metrics.rejected.labels("invalid_message").inc()
                log.warning("agent_message_rejected", reason="invalid_message", detail=result.error, node=node.node_id)
            elif stream.rejected is None:
                stream.rejected = StreamRejected(grpc.StatusCode.INVALID_ARGUMENT, "invalid_message", result.error)
                if stream.reject is not None:
                    stream.reject(grpc.StatusCode.INVALID_ARGUMENT, "invalid_message", result.error)
            return
        self.registry.record_shard_result(node, result)
        if stream is not None and result.full_report_needed:
            node.full_report_needed = True  # the ack asks for a full report (and is not spaced)
        self._decided(node, result.submitted, result.timestamp_ms, stream)

    async def _drain(self, node: NodeRecord, sharded: _ShardedStream) -> None:
        """An ending stream waits for its reports' verdicts: acks go out, an invalid one still ends it."""
        if sharded.pending > 0:
            sharded.drained = asyncio.Event()
            try:
                await asyncio.wait_for(sharded.drained.wait(), SHARD_DRAIN_TIMEOUT_S)
            except TimeoutError:
                log.warning("shard_verdicts_late", node=node.node_id, pending=sharded.pending)
        if sharded.rejected is not None:
            raise sharded.rejected

    async def _write_loop(self, context: grpc.aio.ServicerContext, node: NodeRecord, wake: asyncio.Event) -> None:
        """Send acks (coalesced: one per batch of messages read) and queued commands.

        One event wakes it for both: a command arriving sets it through a done callback,
        so an ack costs one Event wait, not two tasks and an asyncio.wait per message.
        """
        sent = (-1, -1)

        def next_command() -> asyncio.Future[spb.Command]:
            fut = asyncio.ensure_future(node.commands.get())
            fut.add_done_callback(lambda _: wake.set())
            return fut

        command_wait = next_command()
        try:
            while True:
                await wake.wait()
                wake.clear()
                if command_wait.done():
                    self.metrics.command_queue.dec()
                    await context.write(spb.ControllerMessage(command=command_wait.result()))
                    command_wait = next_command()
                current = (node.acked_event_seq, node.acked_report_seq)
                if current != sent or node.full_report_needed:
                    if self.before_ack is not None:
                        await self.before_ack()  # read before: only what is stored by now is acked
                    ack = spb.Ack(event_seq=current[0], report_seq=current[1])
                    if node.full_report_needed:
                        node.full_report_needed = False
                        ack.full_report_needed = True
                    await context.write(spb.ControllerMessage(ack=ack))
                    sent = current
        finally:
            command_wait.cancel()
