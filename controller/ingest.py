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
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.metrics import ControllerMetrics
from controller.ratelimit import TokenBucket
from controller.registry import NodeRecord, NodeRegistry, UnknownNode
from controller.validate import InvalidMessage, validate_event, validate_hello, validate_report
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)


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
        # Awaited before every ack (HA: the events must be in etcd before the agent may forget them).
        self.before_ack: Callable[[], Awaitable[Any]] | None = None

    async def _reject(
        self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str, detail: str
    ) -> None:
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
        full_seen = False  # a delta report needs a full one before it on the same stream
        report_woke_at = -math.inf
        while True:
            msg = await self._read(context)
            if msg is grpc.aio.EOF:
                return
            if writer.done():
                return
            if not bucket.take():
                raise StreamRejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "rate_limited",
                    f"node {node.node_id} exceeds {self.rate_per_s:g} messages/s",
                )
            started = time.perf_counter()
            which = msg.WhichOneof("body")
            try:
                if which == "report":
                    report = msg.report
                    validate_report(report)
                    if not report.counters_delta:
                        full_seen = True
                    elif not full_seen:
                        node.full_report_needed = True  # still used: absent counters read as unchanged
                    self.registry.record_report(node, report)
                elif which == "event":
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
            elapsed = time.perf_counter() - started
            self.metrics.ingest_seconds.observe(elapsed)
            if which == "report":
                stamp = msg.report.timestamp_ms
                if stamp:
                    self.metrics.report_age_seconds.observe(max(0.0, time.time() - stamp / 1000))
                if not node.full_report_needed:
                    # Reports are state, not history: ack them at most every report_ack_interval_s
                    # (an ack is one of the dearest things a stream does); everything else at once.
                    now = time.monotonic()
                    if now - report_woke_at < self.report_ack_interval_s:
                        continue
                    report_woke_at = now
            ack_needed.set()

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
