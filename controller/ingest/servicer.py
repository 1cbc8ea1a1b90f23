"""The gRPC servicer agents stream into.

Per stream: Hello first (validated, node known), then reports and events, each checked
before it reaches the store. Anything wrong ends that stream with a status that says
what was wrong; the controller itself never goes down for a bad message.

Reports are decided by the ``ReportDecider`` the service hands in (controller.ingest.decider):
detection in this process or in its shards, which this module never needs to know. Every
verdict comes back to ``on_verdict`` and is recorded, acked or refused by that one path.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import structlog
from google.protobuf.message import DecodeError

from controller.ingest.decider import ReportDecider
from controller.ingest.quota import IngestQuota
from controller.ingest.ratelimit import TokenBucket
from controller.ingest.registry import NodeRecord, NodeRegistry, UnknownNode
from controller.ingest.validate import InvalidMessage, validate_event, validate_hello, validate_report
from controller.ingest.verdict import ReportResult
from controller.metrics import ControllerMetrics
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

DRAIN_TIMEOUT_S = 10.0  # an ending stream waits this long for its reports' verdicts


class RawReport:
    """A relayed AgentMessage holding a report, not decoded: the decider takes it as it is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class StreamRejected(Exception):
    """Ends one agent stream with a status; raised inside the stream, turned into abort() outside."""

    def __init__(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.reason = reason
        self.detail = detail


@dataclass(eq=False, slots=True)
class StreamClaim:
    """A stream's claim to its node, made the moment its Hello is accepted (before any await,
    so two Hellos arriving together cannot both miss each other): who it is, and how to end it."""

    node: NodeRecord
    task: asyncio.Task[Any]
    reject: Callable[[grpc.StatusCode, str, str], None] | None  # a relayed stream's; None: cancel the task
    epoch: str  # the Hello's buffer epoch and stream generation: an own reconnect or another agent
    generation: int
    boot_id: str
    peer: str
    replaced: StreamRejected | None = None  # a newer stream for the node took over: this one ends with it
    failed: StreamRejected | None = None  # its writer failed (no acks can go out): it ends with this
    closing: bool = False  # its task is past its read, in its clean-up: nothing may cancel it any more


@dataclass(eq=False, slots=True)
class OpenStream:
    """One open agent stream's reports as ingest follows them, whoever decides them.

    A verdict may come back during the hand-over (decided in this process) or later (from
    a shard), so the stream counts what it handed over: an ending stream waits for those
    verdicts, and one that comes back invalid ends the stream even after its read moved on.
    """

    node: NodeRecord
    token: int
    decider: ReportDecider
    bucket: TokenBucket
    ack_needed: asyncio.Event
    writer: asyncio.Task[None]
    reject: Callable[[grpc.StatusCode, str, str], None] | None  # wakes a relayed stream's read to end it
    acked_at: float = -math.inf  # when a report last woke the ack writer (monotonic)
    pending: int = 0  # reports handed over whose verdict is not back yet
    drained: asyncio.Event | None = None  # set when pending reaches 0 (the stream is ending)
    rejected: StreamRejected | None = None  # a verdict found a report invalid: the stream ends with this

    def hand_over(self, message: spb.AgentMessage, started: float) -> None:
        """A decoded report that passed validation, to the decider."""
        self.pending += 1
        self.decider.decide(self.node, message, started)

    def hand_over_raw(self, agent_message: bytes, started: float) -> bool:
        """A relayed report's bytes, to the decider; False: not taken (the stream reads them itself)."""
        self.pending += 1
        if self.decider.decide_raw(self.node, agent_message, started):
            return True
        self.pending -= 1
        return False

    def decide_now(self, agent_message: bytes) -> bool:
        """A relayed report taken as the relay's batch is read, without waking this stream's task.

        RelayLink.dispatch calls it for a report with nothing queued before it: the wake-up
        would cost more than a delta report's detection. False leaves the report to the
        stream's own read, which handles it in order and ends the stream where it must (an
        earlier report's verdict refused the stream, the writer is gone, it is over the rate,
        or it does not decode or validate).
        """
        if self.rejected is not None or self.writer.done() or not self.bucket.take():
            return False
        return self.hand_over_raw(agent_message, time.perf_counter())


class RelayedContext(Protocol):
    """A relayed agent stream (controller.ingest.relayed.RelayedStream), as ``serve`` drives it."""

    # Set while the stream is open: its relay link hands reports to it as the batch is read.
    reports: OpenStream | None

    def reject(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        """End the stream from outside its task (a verdict came back invalid)."""


class TelemetryServicer(sgrpc.TelemetryServicer):
    def __init__(
        self,
        registry: NodeRegistry,
        metrics: ControllerMetrics,
        decider: ReportDecider,
        rate_per_s: float = 200.0,
        burst: float = 5000.0,
        report_interval_s: float = 0.0,
        controller_id: str = "",
        identity_of: Any = None,
        report_ack_interval_s: float = 0.0,
        silence_limit_s: float = 0.0,
        not_nodes: frozenset[str] = frozenset(),
        quota: IngestQuota | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.decider = decider  # who decides reports; its verdicts come back to on_verdict
        decider.bind(self.on_verdict)
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.report_interval_s = report_interval_s
        self.controller_id = controller_id
        self.report_ack_interval_s = report_ack_interval_s
        # What the agent is told (Welcome.silence_limit_s): a stream that sent and heard nothing
        # back this long is dead. Report acks are spaced report_ack_interval_s, so well above it.
        self.silence_limit_s = silence_limit_s or max(30.0, 3 * report_ack_interval_s)
        # identity_of(context) -> node id the peer's certificate names, or None (no mTLS).
        self._identity_of = identity_of
        # Certificates whose role is not "node" (the CLI's admin certificate, a relay's own):
        # refused on a telemetry stream even when the Hello names them (issue 32).
        self._not_nodes = not_nodes
        self.quota = quota  # what one node may store per minute (None: unbounded)
        self._claims: dict[str, StreamClaim] = {}  # node -> the stream that holds it now
        self._streams: dict[str, OpenStream] = {}  # node -> its open stream (where verdicts are answered)
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
        await self.serve(context)

    async def serve(self, context: grpc.aio.ServicerContext, relayed: RelayedContext | None = None) -> None:
        """One agent stream, direct (``context`` is gRPC's) or relayed (both are the RelayedStream)."""
        hello = await self._read_hello(context)
        if hello is None:
            return
        try:
            node = self.registry.register(hello)
        except UnknownNode as exc:
            await self._reject(context, grpc.StatusCode.NOT_FOUND, "unknown_node", str(exc))
            return
        token = node.stream_token
        me = asyncio.current_task()
        assert me is not None
        claim = StreamClaim(
            node,
            me,
            relayed.reject if relayed is not None else None,
            epoch=hello.buffer_epoch,
            generation=hello.stream_generation,
            boot_id=hello.boot_id,
            peer=context.peer(),
        )
        previous = self._claims.get(node.node_id)
        foreign = previous is not None and previous.replaced is None and self._take_over(previous, claim)
        self._claims[node.node_id] = claim
        await context.write(
            spb.ControllerMessage(
                welcome=spb.Welcome(
                    acked_event_seq=node.acked_event_seq,
                    acked_report_seq=node.acked_report_seq,
                    report_interval_s=self.report_interval_s,
                    controller_id=self.controller_id,
                    accepts_delta_reports=True,
                    silence_limit_s=self.silence_limit_s,
                    replaced_live_stream=foreign,
                )
            )
        )
        self.metrics.streams.inc()
        log.info("agent_stream_open", node=node.node_id, acked_event_seq=node.acked_event_seq)
        ack_needed = self._writer_wake(node)
        writer = asyncio.create_task(self._write_loop(context, node, ack_needed))
        stream = OpenStream(
            node,
            token,
            self.decider,
            TokenBucket(self.rate_per_s, self.burst),
            ack_needed,
            writer,
            relayed.reject if relayed is not None else None,
        )
        self._streams[node.node_id] = stream
        writer.add_done_callback(lambda _: self._writer_ended(claim, stream))
        if relayed is not None:
            relayed.reports = stream
        rejected: StreamRejected | None = None
        try:
            await self._read_messages(context, stream)
        except StreamRejected as exc:
            rejected = exc
        except asyncio.CancelledError:
            ending = claim.replaced or claim.failed
            if ending is None:
                raise  # the controller is stopping
            me.uncancel()  # cancelled by _take_over or _writer_ended only to wake the read: end with its status
            rejected = ending
        finally:
            claim.closing = True
            if rejected is None and self._writer_failed(claim, stream) is not None:
                rejected = claim.failed  # the read ended as the writer failed, before its callback ran
            if relayed is not None:
                relayed.reports = None
            # Stop writing before the status goes out: a write racing the abort is a core error.
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            self.metrics.streams.dec()
            self.registry.disconnected(node, token)
            if self._claims.get(node.node_id) is claim:
                del self._claims[node.node_id]
            if self._streams.get(node.node_id) is stream:
                del self._streams[node.node_id]
            log.info("agent_stream_closed", node=node.node_id)
        if rejected is not None:
            await self._reject(context, rejected.code, rejected.reason, rejected.detail)

    def _writer_ended(self, claim: StreamClaim, stream: OpenStream) -> None:
        """The stream's writer stopped by itself: an ack's write or ``before_ack`` (the HA leader's
        flush to etcd) raised. No ack can go out any more, and the agent would only notice at its
        silence limit (30 s) while its events wait unacked: end the stream now with UNAVAILABLE,
        which sends the agent on to the next controller at once (the shared reconnect rule), and
        say why. A writer cancelled as its stream ends is no failure."""
        if claim.closing or self._writer_failed(claim, stream) is None:
            return
        if stream.reject is not None:  # relayed: wake its read with the status
            stream.reject(grpc.StatusCode.UNAVAILABLE, "ack_writer_failed", claim.failed.detail)  # type: ignore[union-attr]
        elif not claim.task.done():
            claim.task.cancel()  # direct: its read is woken by the cancel and ends with the status

    @staticmethod
    def _writer_failed(claim: StreamClaim, stream: OpenStream) -> StreamRejected | None:
        """The status a failed writer ends its stream with (set once in ``claim.failed``, logged
        once), None while the writer runs or when it was cancelled or its stream was replaced."""
        writer = stream.writer
        if claim.failed is not None:
            return claim.failed
        if not writer.done() or writer.cancelled() or claim.replaced is not None:
            return None
        exc = writer.exception()
        if exc is None:
            return None
        node, error = stream.node.node_id, f"{type(exc).__name__}: {exc}"
        log.warning("ack_writer_failed", node=node, error=error)
        claim.failed = StreamRejected(
            grpc.StatusCode.UNAVAILABLE,
            "ack_writer_failed",
            f"node {node}: the controller could not send acks ({error}); reconnect",
        )
        stream.rejected = stream.rejected or claim.failed
        return claim.failed

    async def _read_hello(self, context: grpc.aio.ServicerContext) -> spb.Hello | None:
        """The stream's first message, a valid Hello from the node the certificate names; else
        the stream is ended with its status and None comes back."""
        try:
            first = await self._read(context)
        except StreamRejected as bad:
            await self._reject(context, bad.code, bad.reason, bad.detail)
            return None
        if first is grpc.aio.EOF:
            return None
        if first.WhichOneof("body") != "hello":
            await self._reject(
                context, grpc.StatusCode.FAILED_PRECONDITION, "no_hello", "the first message must be Hello"
            )
            return None
        hello: spb.Hello = first.hello
        try:
            validate_hello(hello)
        except InvalidMessage as exc:
            await self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, "bad_hello", str(exc))
            return None
        if self._identity_of is not None:
            identity = self._identity_of(context)
            if identity in self._not_nodes:
                await self._reject(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    "role_mismatch",
                    f"certificate {identity!r} is not a node's (an admin or relay certificate): it cannot open a"
                    " telemetry stream as a node",
                )
                return None
            if identity != hello.node_id:
                await self._reject(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    "identity_mismatch",
                    f"certificate names {identity!r}, hello claims {hello.node_id!r}",
                )
                return None
        return hello

    def _take_over(self, previous: StreamClaim, new: StreamClaim) -> bool:
        """A Hello for a node whose stream is open: the newest stream wins, the old one is told.

        Who wins: always the newest. An agent whose own stream went half-open (its network
        blinked, the controller has not noticed yet) must get back at once, and the controller
        cannot tell a dead stream from a live one before its silence limit. The replaced stream
        ends with ABORTED, which its agent acts on (reconnects after its backoff, by the shared
        rule), so a real agent displaced by an imposter comes back and displaces it in turn: the
        fight is seen (``agent_conflict``), never a silent orphan. An own reconnect (same buffer
        epoch, a higher stream generation or a new boot) is routine; anything else is a second
        claimant of the node's identity: logged as a security event and counted. Returns
        whether it was foreign.
        """
        own = previous.epoch == new.epoch and (
            new.generation == 0  # an agent older than stream generations
            or previous.generation == 0
            or new.generation > previous.generation
            or new.boot_id not in ("", previous.boot_id)
        )
        node = previous.node
        detail = (
            f"node {node.node_id}: this stream was replaced by a newer stream for the same node"
            f" from {new.peer}; reconnect if this agent is the node's own"
        )
        previous.replaced = StreamRejected(grpc.StatusCode.ABORTED, "replaced", detail)
        if previous.reject is not None:  # relayed: wake its read with the status
            previous.reject(grpc.StatusCode.ABORTED, "replaced", detail)
        elif not previous.task.done():
            previous.task.cancel()  # direct: its read is woken by the cancel and ends with the status
        kind = "reconnect" if own else "foreign"
        self.metrics.stream_takeovers.labels(kind).inc()
        if own:
            log.info("agent_stream_replaced_by_reconnect", node=node.node_id, old_peer=previous.peer, new_peer=new.peer)
            return False
        log.warning(
            "agent_stream_takeover",
            security=True,
            node=node.node_id,
            old_peer=previous.peer,
            new_peer=new.peer,
            old_epoch=previous.epoch,
            new_epoch=new.epoch,
            old_generation=previous.generation,
            new_generation=new.generation,
        )
        self.registry.taken_over(node, previous.peer, new.peer)
        return True

    @staticmethod
    def _writer_wake(node: NodeRecord) -> asyncio.Event:
        """What wakes the stream's writer: a read to ack, a command, or a new probe plan (set
        at once when the node has one: it goes out right after the Welcome)."""
        wake = asyncio.Event()
        node.stream_wake = wake
        if node.probe_plan is not None:
            wake.set()
        return wake

    async def _read_messages(self, context: grpc.aio.ServicerContext, stream: OpenStream) -> None:
        node, bucket, decider = stream.node, stream.bucket, self.decider
        ack_needed = stream.ack_needed
        while True:
            msg = await self._read(context)
            if stream.rejected is not None:
                raise stream.rejected
            if msg is grpc.aio.EOF:
                await self._drain(stream)
                return
            if stream.writer.done():
                return
            if not bucket.take():
                raise StreamRejected(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "rate_limited",
                    f"node {node.node_id} exceeds {self.rate_per_s:g} messages/s",
                )
            started = time.perf_counter()
            if type(msg) is RawReport:
                if stream.hand_over_raw(msg.data, started):
                    if decider.full:
                        await decider.room()
                    continue
                try:  # not taken: it does not decode (refused here) or validate (refused below)
                    msg = spb.AgentMessage.FromString(msg.data)
                except DecodeError as exc:
                    raise StreamRejected(
                        grpc.StatusCode.INVALID_ARGUMENT, "malformed", f"message is not an AgentMessage: {exc}"
                    ) from None
            which = msg.WhichOneof("body")
            try:
                if which == "report":
                    validate_report(msg.report)
                    stream.hand_over(msg, started)
                    if decider.full:
                        await decider.room()
                    continue
                if which == "event":
                    self._take_event(node, msg.event)
                elif which == "command_result":
                    self.registry.touch(node)
                    self.registry.command_result(node, msg.command_result)
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

    def _take_event(self, node: NodeRecord, event: Any) -> None:
        """One event: checked (InvalidMessage), charged to the node's write quota, then stored."""
        validate_event(event)
        if self.quota is not None:
            over = self.quota.charge(node.node_id, 1, event.ByteSize())
            if over is not None:
                raise StreamRejected(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota", over)
        self.registry.record_events(node, [event])

    def on_verdict(self, verdict: ReportResult) -> None:
        """A report was decided (here or in a shard): record it and ack it, or end its stream if invalid."""
        node = self.registry.nodes.get(verdict.node_id)
        if node is None:
            return
        stream = self._streams.get(verdict.node_id)
        if stream is not None and stream.token != verdict.stream_token:
            stream = None  # from a stream that has ended since: record it, answer nobody
        if stream is not None:
            stream.pending -= 1
            if stream.pending <= 0 and stream.drained is not None:
                stream.drained.set()
        if verdict.error:
            if stream is None:
                self.metrics.rejected.labels("invalid_message").inc()
                log.warning("agent_message_rejected", reason="invalid_message", detail=verdict.error, node=node.node_id)
            elif stream.rejected is None:
                stream.rejected = StreamRejected(grpc.StatusCode.INVALID_ARGUMENT, "invalid_message", verdict.error)
                if stream.reject is not None:
                    stream.reject(grpc.StatusCode.INVALID_ARGUMENT, "invalid_message", verdict.error)
            return
        self.registry.record_report(node, verdict)
        if stream is not None and verdict.full_report_needed:
            node.full_report_needed = True  # the ack asks for a full report (and is not spaced)
        self._decided(node, verdict.submitted, verdict.timestamp_ms, stream)

    def _decided(self, node: NodeRecord, started: float, stamp_ms: int, stream: OpenStream | None) -> None:
        """A report's decision is in: the decision histograms, then its ack when due."""
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

    async def _drain(self, stream: OpenStream) -> None:
        """An ending stream waits for its reports' verdicts: acks go out, an invalid one still ends it."""
        if stream.pending > 0:
            stream.drained = asyncio.Event()
            try:
                await asyncio.wait_for(stream.drained.wait(), DRAIN_TIMEOUT_S)
            except TimeoutError:
                log.warning("report_verdicts_late", node=stream.node.node_id, pending=stream.pending)
        if stream.rejected is not None:
            raise stream.rejected

    async def _write_loop(self, context: grpc.aio.ServicerContext, node: NodeRecord, wake: asyncio.Event) -> None:
        """Send acks (coalesced: one per batch of messages read) and queued commands.

        One event wakes it for both: a command arriving sets it through a done callback,
        so an ack costs one Event wait, not two tasks and an asyncio.wait per message.
        """
        sent = (-1, -1)
        plan_sent = 0

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
                plan = node.probe_plan
                if plan is not None and plan.version != plan_sent:
                    await context.write(spb.ControllerMessage(probe_plan=plan))
                    plan_sent = plan.version
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
            if node.stream_wake is wake:
                node.stream_wake = None
