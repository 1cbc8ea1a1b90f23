"""The agent's half of the stream: connect, say Hello, replay the buffer, stream, reconnect.

One long-lived bidirectional gRPC stream per agent. Events come from the on-disk
buffer and are forgotten only when acked; after any disconnect the agent resumes from
what the controller says it holds (Welcome.acked_event_seq), so a restart on either
side neither loses nor repeats an event. Reports are state, not history: only the
newest unsent one is kept while the controller is away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc
import structlog

from agent.transport.buffer import EventBuffer
from agent.transport.delta import ReportDelta
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.grpc_client import CLIENT_CHANNEL_OPTIONS, Backoff, NotAccepted, Reconnector, read, send
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

CommandHandler = Callable[[spb.Command], Awaitable[spb.CommandResult]]

# A controller that answers nothing for this long while we send is gone, whatever TCP says
# (used until a Welcome names its own limit: Welcome.silence_limit_s).
DEFAULT_SILENCE_LIMIT_S = 60.0
# A stream displaced sooner than this after it was welcomed is a fight over the node (an
# imposter coming straight back): the reconnect backoff keeps growing instead of starting over.
STABLE_STREAM_S = 10.0


class StreamSilent(TimeoutError):
    """We sent and the controller answered nothing within the silence limit: the stream is dead.

    A TimeoutError: the shared reconnect rule (``after_failure``) moves on to the next controller.
    """


class ControllerLink:
    """Keeps one stream to the controller open and moves buffered events and reports over it."""

    def __init__(
        self,
        targets: Sequence[str],
        hello: Callable[[], spb.Hello],
        buffer: EventBuffer,
        on_command: CommandHandler | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        backoff: Backoff | None = None,
        max_in_flight: int = 1000,
        seed: int | None = None,
        on_probe_plan: Callable[[spb.ProbePlan], None] | None = None,
    ) -> None:
        # Which controller next and how long to wait: the rule every starpulse client shares.
        self.reconnect = Reconnector(targets, backoff, seed, name="agent", clock=SYSTEM_CLOCK)
        self.targets = self.reconnect.targets  # the same list: a leader a standby names is added to it
        self.backoff = self.reconnect.backoff
        self._hello = hello
        self.buffer = buffer
        self._on_command = on_command
        self._on_probe_plan = on_probe_plan
        self._credentials = credentials
        self.max_in_flight = max_in_flight
        self._wake = asyncio.Event()
        self._latest_report: tpb.Report | None = None
        # seq -> when the buffer held it (wall-clock us): the event's buffered_us stamp. Only
        # this process's events; one replayed after a restart goes without it.
        self._buffered_us: dict[int, int] = {}
        self.delta = ReportDelta()  # delta reports, when the controller accepts them
        self._stopping = False
        self._blocked = False
        self._call: grpc.aio.StreamStreamCall | None = None
        self._command_tasks: set[asyncio.Task[None]] = set()
        self.connected = asyncio.Event()
        self.acked_event_seq = 0
        self.acked_report_seq = 0
        self.reports_sent = 0
        self.reports_replaced = 0
        self.connects = 0
        self.report_interval_hint_s = 0.0
        # Stream generations rise across this agent's restarts too (start time, then +1 per
        # stream): with the buffer epoch they tell our own reconnect from a second agent.
        self._generation = int(time.time() * 1000) * 1000
        self.silence_limit_s = DEFAULT_SILENCE_LIMIT_S
        self._unanswered_since: float | None = None  # first write since the controller last spoke
        self.replaced = 0  # streams the controller ended because another stream took the node over
        self.silent_streams = 0  # streams ended here because the controller went silent
        self._replaced_last = False  # the last stream was displaced soon after it began: keep backing off

    # -- producer side -------------------------------------------------------------
    def wake(self) -> None:
        """New events are in the buffer."""
        self._wake.set()

    def note_buffered(self, seq: int) -> None:
        """The buffer committed event ``seq`` now (its buffered stage stamp); the link is woken too."""
        self._buffered_us[seq] = int(time.time() * 1e6)
        if len(self._buffered_us) > 2 * self.max_in_flight:  # the controller is away: keep the newest
            for old in sorted(self._buffered_us)[: len(self._buffered_us) - self.max_in_flight]:
                del self._buffered_us[old]
        self._wake.set()

    def offer_report(self, report: tpb.Report) -> None:
        """Queue a report; an older unsent one is replaced (reports are state, not history)."""
        if self._latest_report is not None:
            self.reports_replaced += 1
            # LLDP updates are sent only on change: carry one forward rather than lose it.
            if self._latest_report.HasField("lldp") and not report.HasField("lldp"):
                report.lldp.CopyFrom(self._latest_report.lldp)
            # Probe results are each window's once: carry the unsent ones forward too.
            if self._latest_report.probe_results:
                newer = list(report.probe_results)
                del report.probe_results[:]
                report.probe_results.extend([*self._latest_report.probe_results, *newer])
        self._latest_report = report
        self._wake.set()

    def set_blocked(self, blocked: bool) -> None:
        """Simulate a cut network (sim and scenarios): drop the stream and stay away."""
        self._blocked = blocked
        if blocked and self._call is not None:
            self._call.cancel()
        self._wake.set()

    # -- lifecycle ------------------------------------------------------------------
    async def run(self) -> None:
        """Connect and stream until stop(); reconnect on any failure, by the shared rule (``after_failure``)."""
        await self.reconnect.run(
            self._session, stopping=lambda: self._stopping, ended=self._ended, paused=lambda: self._blocked
        )

    def _ended(self) -> None:
        self.connected.clear()
        self._call = None

    async def stop(self) -> None:
        """Stop streaming; unsent events stay in the buffer for the next start."""
        self._stopping = True
        if self._call is not None:
            self._call.cancel()
        self._wake.set()

    # -- one stream -----------------------------------------------------------------
    async def _session(self, target: str) -> None:
        channel = (
            grpc.aio.secure_channel(target, self._credentials, options=CLIENT_CHANNEL_OPTIONS)
            if self._credentials is not None
            else grpc.aio.insecure_channel(target, options=CLIENT_CHANNEL_OPTIONS)
        )
        try:
            stub = sgrpc.TelemetryStub(channel)
            call = stub.Connect()
            self._call = call
            hello = self._hello()
            hello.buffer_epoch = self.buffer.epoch
            hello.oldest_buffered_event_seq = self.buffer.oldest_seq()
            hello.next_event_seq = self.buffer.next_seq
            self._generation += 1
            hello.stream_generation = self._generation
            await send(call, spb.AgentMessage(hello=hello))
            first = await asyncio.wait_for(read(call), timeout=30)
            if first is grpc.aio.EOF or not first.HasField("welcome"):
                raise NotAccepted("controller closed the stream without a Welcome")
            welcome = first.welcome
            self._apply_ack(welcome.acked_event_seq, welcome.acked_report_seq)
            self.report_interval_hint_s = welcome.report_interval_s
            self.delta.reset(enabled=welcome.accepts_delta_reports)
            self.connects += 1
            welcomed_at = time.monotonic()
            self.silence_limit_s = welcome.silence_limit_s or DEFAULT_SILENCE_LIMIT_S
            self._unanswered_since = None
            if not self._replaced_last:
                self.reconnect.accepted()  # displaced again and again: the backoff keeps growing
            self._replaced_last = False
            if welcome.replaced_live_stream:
                log.warning(
                    "agent_identity_contested",
                    security=True,
                    target=target,
                    detail="this stream replaced another live stream for this node: another agent holds its identity",
                )
            self.connected.set()
            log.info(
                "controller_connected",
                target=target,
                acked_event_seq=welcome.acked_event_seq,
                buffered=self.buffer.depth(),
            )
            reader = asyncio.create_task(self._read_loop(call))
            reader.add_done_callback(lambda _task: self._wake.set())  # the write loop sees the stream end
            try:
                await self._write_loop(call, reader)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.ABORTED:
                    # Another stream for this node took over: reconnect (after the backoff) and
                    # say so; if it was an imposter, the controller sees the fight.
                    self.replaced += 1
                    self._replaced_last = time.monotonic() - welcomed_at < STABLE_STREAM_S
                    log.warning("agent_stream_replaced", security=True, target=target, detail=err.details())
                raise
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                call.cancel()
        finally:
            await channel.close(grace=None)

    def _apply_ack(self, event_seq: int, report_seq: int) -> None:
        # The controller is the authority: after its restart it may know less than before.
        self.acked_event_seq = event_seq
        self.acked_report_seq = max(self.acked_report_seq, report_seq)
        if event_seq:
            self.buffer.ack(event_seq)

    async def _read_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            msg = await read(call)
            if msg is grpc.aio.EOF:
                return
            self._unanswered_since = None  # the controller spoke: everything sent so far is answered or coming
            which = msg.WhichOneof("body")
            if which == "ack":
                self._apply_ack(msg.ack.event_seq, msg.ack.report_seq)
                if msg.ack.full_report_needed:
                    self.delta.force_full()
                self._wake.set()
            elif which == "probe_plan":
                if self._on_probe_plan is not None:
                    self._on_probe_plan(msg.probe_plan)
            elif which == "command":
                task = asyncio.create_task(self._run_command(call, msg.command))
                self._command_tasks.add(task)
                task.add_done_callback(self._command_tasks.discard)
            else:
                log.warning("unexpected_controller_message", kind=which)

    async def _run_command(self, call: grpc.aio.StreamStreamCall, command: spb.Command) -> None:
        if self._on_command is None:
            result = spb.CommandResult(id=command.id, ok=False, message="this agent runs no commands")
        else:
            try:
                result = await self._on_command(command)
            except Exception as exc:
                log.exception("command_failed", id=command.id)
                result = spb.CommandResult(id=command.id, ok=False, message=str(exc))
        try:
            await call.write(spb.AgentMessage(command_result=result))
        except Exception:
            log.warning("command_result_not_sent", id=command.id)

    async def _write_loop(self, call: grpc.aio.StreamStreamCall, reader: asyncio.Task[None]) -> None:
        sent_upto = self.acked_event_seq
        while not self._stopping and not self._blocked:
            if reader.done():
                reader.result()  # re-raise the stream error, if any
                raise ConnectionError("controller ended the stream")
            self._check_silence()
            self._wake.clear()
            progressed = False
            # Events first (they are history); never more than max_in_flight unacked.
            sent_upto = max(sent_upto, self.acked_event_seq)
            room = self.max_in_flight - (sent_upto - self.acked_event_seq)
            if room > 0:
                for event in self.buffer.pending(sent_upto, limit=min(room, 500)):
                    event.buffered_us = self._buffered_us.pop(event.seq, 0)
                    event.sent_us = int(time.time() * 1e6)
                    await send(call, spb.AgentMessage(event=event))
                    self._sent()
                    sent_upto = event.seq
                    progressed = True
            report = self._latest_report
            if report is not None:
                self._latest_report = None
                msg = spb.AgentMessage()
                self.delta.encode_into(report, msg.report)  # one copy, full or delta
                await send(call, msg)
                self._sent()
                self.reports_sent += 1
                progressed = True
            if not progressed:
                # One timer handle instead of a waiter task and asyncio.wait per report: the
                # reader's end sets _wake too (done callback), so waiting on it alone suffices.
                timer = asyncio.get_running_loop().call_later(5.0, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()

    def _sent(self) -> None:
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()

    def _check_silence(self) -> None:
        """End a stream the controller stopped answering (keepalive only sees the TCP connection).

        A half-open stream, a controller that orphaned it, a wedged handler: pings still pass,
        writes still fit in the window, and nothing is ever acked. The bound is on the time since
        the first unanswered send, so an idle stream is never called dead.
        """
        since = self._unanswered_since
        if since is not None and time.monotonic() - since > self.silence_limit_s:
            self.silent_streams += 1
            raise StreamSilent(f"the controller answered nothing for {self.silence_limit_s:g} s while this agent sent")
