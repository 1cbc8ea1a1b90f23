"""Who is out there: nodes, their inventory, their latest report, and whether they are heard.

Presence is only "online" or "unreachable" here: a missing heartbeat is a fact, not a
verdict. Deciding what it means (a dead node, a partition) is detection's job.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import structlog

from controller.ingest.validate import InvalidMessage
from controller.metrics import ControllerMetrics
from controller.stages import StageTracker
from controller.store import Store, StoredNode
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

if TYPE_CHECKING:
    from controller.ingest.verdict import ReportResult

log = structlog.get_logger(__name__)

# The most an event's seq may run ahead of the node's stored position on one stream: events on a
# stream are contiguous, and a buffer's overflow is settled at Hello (oldest_buffered_event_seq).
MAX_SEQ_JUMP = 1_000_000
# An agent stamp further than this from the controller's clock is flagged (logged with both
# dates, counted, shown on the node page): its events' times cannot be compared with others'.
MAX_CLOCK_SKEW_MS = 5 * 60 * 1000
PRESENCE_ROWS_PER_FLUSH = 250  # last-seen rows a sweep writes (state changes come on top)
ONLINE = "online"
UNREACHABLE = "unreachable"


@dataclass
class NodeRecord:
    node_id: str
    role: int
    state: str
    first_seen_ms: int
    last_seen_ms: int
    agent_version: str = ""
    hostname: str = ""
    inventory: ipb.Inventory = field(default_factory=ipb.Inventory)
    epoch: str = ""
    acked_event_seq: int = 0
    acked_report_seq: int = 0
    latest_report: tpb.Report | None = None
    lldp: list[ipb.LldpNeighbor] = field(default_factory=list)  # latest learned neighbours
    connected: bool = False
    stream_token: int = 0
    commands: asyncio.Queue[spb.Command] = field(default_factory=asyncio.Queue)
    full_report_needed: bool = False  # ask the agent for a full report with the next ack
    boot_id: str = ""  # the kernel's boot id from the last Hello ("" from an older agent)
    takeovers: int = 0  # foreign stream takeovers since the controller started (issue 32)
    clock_skew_ms: int = 0  # agent's clock minus ours, when past MAX_CLOCK_SKEW_MS (0: within it)
    connected_ms: int = 0  # when its current stream said Hello
    # Since when its probe results (and its peers' towards it) are trusted: when its agent process,
    # and so its prober, last started (``prober_since``); a mere reconnect does not move it.
    probes_since_ms: int = 0
    probe_plan: spb.ProbePlan | None = None  # its part of the probe mesh, pushed on its stream
    stream_wake: asyncio.Event | None = None  # wakes its stream's writer (a new probe plan)
    # Issue 30: the latest accelerator check (Hello, then every report); None from an older agent.
    accelerator_check: tpb.AcceleratorCheck | None = None

    @property
    def not_judged_why(self) -> str:
        """Why this node's accelerators were not read ("" when they were, or no agent said)."""
        check = self.accelerator_check
        return "" if check is None or check.judged else (check.reason or "accelerators not read")

    def to_stored(self) -> StoredNode:
        return StoredNode(
            node_id=self.node_id,
            role=self.role,
            state=self.state,
            first_seen_ms=self.first_seen_ms,
            last_seen_ms=self.last_seen_ms,
            agent_version=self.agent_version,
            hostname=self.hostname,
            inventory=self.inventory,
            buffer_epoch=self.epoch,
            acked_event_seq=self.acked_event_seq,
        )


class IngestListener(Protocol):
    """Who hears what ingest recorded: the decision core (controller.core), handed in at
    construction, and any observer a demo or test adds; called on the controller's event loop."""

    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        """One decided report, whoever decided it (controller.ingest.decider).

        ``verdict.report`` is the report itself where this process decided it, None
        where a detection shard did; the rest (signals, job steps, LLDP) is always there.
        """

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None: ...

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None: ...


def prober_since(generation: int, heard_ms: int, now_ms: int) -> int:
    """Since when a (re)connecting agent's prober has been running, as far as the Hello tells.

    The agent's stream generation is its process's start time in ms times 1,000 plus its stream
    tries (agent.transport.link), so the Hello names the process. A process this controller, or
    the one before it (the node's stored last-seen time), already heard from had its plan and has
    probed since it started: a controller restart or failover, where every agent reconnects, is
    not a prober restart, and its results count at once. A process not heard from before (a new
    agent, or one that started while no controller answered and so had no plan), or an agent
    older than start-stamped generations, restarted now: its paths wait one window (its peers
    lost probes to its restart, not to the network). ``heard_ms``: when the node was last heard
    from before this Hello (-1: never).
    """
    started_ms = generation // 1000
    if started_ms < _STAMPED_SINCE_MS or started_ms > heard_ms:
        return now_ms
    return started_ms


_STAMPED_SINCE_MS = 1_000_000_000_000  # 2001: a smaller generation is a plain count (an older agent)


class UnknownNode(LookupError):
    pass


class NodeRegistry:
    def __init__(
        self,
        store: Store,
        metrics: ControllerMetrics,
        heartbeat_timeout_s: float,
        allowed_nodes: Iterable[str] | None = None,
        *,
        clock: Clock,
        last_seen_flush_s: float = 15.0,
        listeners: Sequence[IngestListener] = (),
        stages: StageTracker | None = None,
        on_takeover: Callable[[NodeRecord, str, str], None] | None = None,
        sweep_interval_s: float = 1.0,
    ) -> None:
        """``listeners``: who hears each recorded report, batch of events and presence change
        (the decision core); ``stages``: the per-stage latency trace (events' received mark);
        ``sweep_interval_s``: how often ``sweep`` is meant to run (a longer gap is the
        controller's own lag, not its nodes' silence)."""
        self.store = store
        self.metrics = metrics
        self.heartbeat_timeout_ms = int(heartbeat_timeout_s * 1000)
        self.allowed_nodes = set(allowed_nodes) if allowed_nodes is not None else None
        self.clock = clock  # presence and last-seen times; the dashboard's "now" too
        self._clock_ms = clock.time_ms
        self.nodes: dict[str, NodeRecord] = {}
        self.listeners: list[IngestListener] = list(listeners)
        self.stages = stages
        self._on_takeover = on_takeover  # a foreign stream replaced a node's live one (the decision core)
        self._stream_counter = 0
        self._started_ms = clock.time_ms()
        self._sweep_ms = int(sweep_interval_s * 1000)
        self._last_sweep_ms: int | None = None
        self._stalls: list[tuple[int, int]] = []  # (when the controller resumed, ms it had stood still)
        self.lag_ms = 0  # the last sweep's lateness: the controller's own lag
        self._presence_dirty: set[str] = set()
        # Last-seen times are written at most this often (a state change at once): each is
        # only a restart's starting point, and writing every report's was ~5 % of a core at
        # 10,000 nodes. A restart gives every node a full heartbeat timeout anyway.
        self._last_seen_flush_ms = int(last_seen_flush_s * 1000)
        self._state_changed: set[str] = set()  # written at the next sweep, whatever the cadence
        self._flushed_ms = clock.time_ms()
        # Bumped on every registration and presence change: the dashboard's change check
        # compares this instead of sorting every node's state once a second.
        self.presence_version = 0
        self._command_waiters: dict[str, asyncio.Future[spb.CommandResult]] = {}  # command id -> answer
        # The per-report counters, bound once: a labels() lookup per report costs more than the inc.
        self._reports_inc = metrics.reports.inc
        self._gpu_samples_inc = metrics.samples.labels("gpu").inc
        self._nic_samples_inc = metrics.samples.labels("nic").inc
        self._port_samples_inc = metrics.samples.labels("switch_port").inc
        for stored in store.load_nodes():
            self.nodes[stored.node_id] = NodeRecord(
                node_id=stored.node_id,
                role=stored.role,
                state=stored.state,
                first_seen_ms=stored.first_seen_ms,
                last_seen_ms=stored.last_seen_ms,
                agent_version=stored.agent_version,
                hostname=stored.hostname,
                inventory=stored.inventory,
                epoch=stored.buffer_epoch,
                acked_event_seq=stored.acked_event_seq,
            )
        # A node left not judged stays so across a controller restart until its agent says otherwise.
        for node_id, event in store.latest_events_of_kind(tpb.EVENT_KIND_ACCEL_CHECK).items():
            record = self.nodes.get(node_id)
            if record is not None and event.attributes.get("judged") == "false":
                reason = event.message.removeprefix("not judged: ")
                record.accelerator_check = tpb.AcceleratorCheck(judged=False, reason=reason)
        metrics.not_judged.set_function(self._count_not_judged)
        # Counted when scraped: counting on every change made a herd of 10,000 Hellos
        # quadratic (two thirds of the controller's time while every agent reconnected).
        for state in (ONLINE, UNREACHABLE):
            metrics.nodes.labels(state).set_function(functools.partial(self._count_state, state))

    # -- registration ----------------------------------------------------------------
    def register(self, hello: spb.Hello) -> NodeRecord:
        """Record a (re)connecting agent and decide where its event stream resumes."""
        if self.allowed_nodes is not None and hello.node_id not in self.allowed_nodes:
            raise UnknownNode(f"node {hello.node_id!r} is not in this controller's fabric")
        now = self._clock_ms()
        node = self.nodes.get(hello.node_id)
        heard_ms = node.last_seen_ms if node is not None else -1  # before this Hello (stored, after a restart)
        if node is None:
            node = NodeRecord(
                node_id=hello.node_id,
                role=hello.role,
                state=ONLINE,
                first_seen_ms=now,
                last_seen_ms=now,
            )
            self.nodes[hello.node_id] = node
            log.info("node_registered", node=hello.node_id, gpus=len(hello.inventory.gpus))
        old_state = node.state
        node.role = hello.role
        node.agent_version = hello.agent_version
        node.hostname = hello.inventory.host.hostname
        node.inventory.CopyFrom(hello.inventory)
        node.lldp = list(hello.inventory.lldp_neighbors)
        if hello.boot_id and node.boot_id and hello.boot_id != node.boot_id:
            log.info("node_rebooted", node=node.node_id, old_boot=node.boot_id, new_boot=hello.boot_id)
        node.boot_id = hello.boot_id or node.boot_id
        node.accelerator_check = hello.accelerators if hello.HasField("accelerators") else None
        if node.not_judged_why:
            log.warning("node_not_judged", node=node.node_id, why=node.not_judged_why)
        if node.epoch != hello.buffer_epoch:
            # A new buffer file on the agent: its sequence starts over, in a new epoch. Or an
            # epoch seen before (the real agent back after another client claimed the node):
            # it resumes where its events were stored, not at 0 (no false loss, no resend).
            log.info("node_new_buffer_epoch", node=node.node_id, old=node.epoch, new=hello.buffer_epoch)
            node.epoch = hello.buffer_epoch
            node.acked_event_seq = self.store.last_event_seq(node.node_id, hello.buffer_epoch)
        if hello.oldest_buffered_event_seq > node.acked_event_seq + 1:
            lost = hello.oldest_buffered_event_seq - node.acked_event_seq - 1
            log.warning("node_events_lost_in_agent", node=node.node_id, lost=lost)
            self.metrics.lost_events.inc(lost)
            node.acked_event_seq = hello.oldest_buffered_event_seq - 1
        node.probes_since_ms = prober_since(hello.stream_generation, heard_ms, now)
        node.last_seen_ms = now
        node.connected_ms = now
        node.state = ONLINE
        self.presence_version += 1
        node.connected = True
        self._stream_counter += 1
        node.stream_token = self._stream_counter
        self.store.upsert_node(node.to_stored())
        if old_state != ONLINE:
            self._notify_presence(node, old_state, ONLINE)
        return node

    def _check_clock(self, node: NodeRecord, stamp_ms: int) -> None:
        """Flag an agent whose stamps are far from our clock; log each change once, with dates."""
        skew = stamp_ms - self._clock_ms()
        skewed = abs(skew) > MAX_CLOCK_SKEW_MS
        if skewed == (node.clock_skew_ms != 0):
            if skewed:
                node.clock_skew_ms = skew
            return
        node.clock_skew_ms = skew if skewed else 0
        if skewed:
            self.metrics.clock_skewed.inc()
        else:
            self.metrics.clock_skewed.dec()
        log.warning(
            "agent_clock_skewed" if skewed else "agent_clock_back_in_step",
            node=node.node_id,
            agent_time=_iso(stamp_ms),
            controller_time=_iso(self._clock_ms()),
            skew_s=round(skew / 1000, 1),
        )

    def taken_over(self, node: NodeRecord, old_peer: str, new_peer: str) -> None:
        """A stream that is not the agent's own reconnect replaced ``node``'s live stream."""
        node.takeovers += 1
        if self._on_takeover is not None:
            self._on_takeover(node, old_peer, new_peer)

    def disconnected(self, node: NodeRecord, token: int) -> None:
        if node.stream_token == token:
            node.connected = False

    # -- ingest ----------------------------------------------------------------------
    def touch(self, node: NodeRecord) -> None:
        node.last_seen_ms = self._clock_ms()
        self._presence_dirty.add(node.node_id)
        if node.state != ONLINE:
            old = node.state
            node.state = ONLINE
            self._state_changed.add(node.node_id)
            self.presence_version += 1
            self._notify_presence(node, old, ONLINE)

    def record_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        """A decided report, wherever it was decided: presence, ack position, counts, LLDP, listeners."""
        self.touch(node)
        node.acked_report_seq = max(node.acked_report_seq, verdict.seq)
        self._reports_inc()
        self._gpu_samples_inc(verdict.gpus)
        self._nic_samples_inc(verdict.nics)
        if verdict.switch_ports:
            self._port_samples_inc(verdict.switch_ports)
        if verdict.lldp is not None:
            node.lldp = verdict.lldp
        if verdict.accelerator_check is not None:
            was = node.not_judged_why
            node.accelerator_check = verdict.accelerator_check
            if node.not_judged_why != was:
                log.info(
                    "node_judged_changed", node=node.node_id, judged=not node.not_judged_why, why=node.not_judged_why
                )
        node.latest_report = verdict.report  # None with shards: the report stays in its shard
        if verdict.timestamp_ms:
            self._check_clock(node, verdict.timestamp_ms)
        for listener in self.listeners:
            try:
                listener.on_report(node, verdict)
            except Exception:
                log.exception("listener_failed", hook="on_report", node=node.node_id)

    def record_events(self, node: NodeRecord, events: list[tpb.Event]) -> list[tpb.Event]:
        """Store new events idempotently; returns the ones that were new."""
        self.touch(node)
        fresh: list[tpb.Event] = []
        acked = node.acked_event_seq
        for ev in events:
            if ev.seq <= acked:
                self.metrics.duplicate_events.inc()
                continue
            if ev.seq > acked + MAX_SEQ_JUMP:
                # Taken, every real event below it would read as a replay and be dropped: one
                # forged number would silence the node's events for the rest of the epoch.
                raise InvalidMessage(
                    f"event seq {ev.seq} jumps {ev.seq - acked} past the last stored ({acked}; max jump {MAX_SEQ_JUMP})"
                )
            if ev.seq > acked + 1:
                lost = ev.seq - acked - 1
                log.warning("event_gap", node=node.node_id, expected=acked + 1, got=ev.seq)
                self.metrics.lost_events.inc(lost)
            acked = ev.seq
            fresh.append(ev)
        if not fresh:
            return []
        if self.stages is not None:
            for ev in fresh:
                kind = tpb.EventKind.Name(ev.kind).removeprefix("EVENT_KIND_").lower()
                self.stages.received(node.node_id, ev.seq, kind, ev.component, (ev.read_us, ev.buffered_us, ev.sent_us))
        if fresh[-1].timestamp_ms:
            self._check_clock(node, fresh[-1].timestamp_ms)
        self.store.insert_events(node.node_id, node.epoch, fresh, self._clock_ms(), acked)
        node.acked_event_seq = acked
        for ev in fresh:
            self.metrics.events.labels(tpb.EventKind.Name(ev.kind).removeprefix("EVENT_KIND_").lower()).inc()
        for listener in self.listeners:
            try:
                listener.on_events(node, fresh)
            except Exception:
                log.exception("listener_failed", hook="on_events", node=node.node_id)
        return fresh

    # -- presence --------------------------------------------------------------------
    def sweep(self) -> list[NodeRecord]:
        """Mark nodes not heard within the timeout unreachable; returns the newly unreachable.

        After a controller restart every node gets one full timeout to reconnect, so a
        restart never looks like the whole fleet going silent.
        """
        now = self._clock_ms()
        changed: list[NodeRecord] = []
        self._note_lag(now)
        cutoff = now - self.heartbeat_timeout_ms  # heard before this: silent too long
        if self._started_ms >= cutoff:
            return changed  # the controller itself has not run a whole timeout yet
        # Every second over every node: one comprehension, not a loop body per node.
        silent = [n for n in self.nodes.values() if n.last_seen_ms < cutoff and n.state == ONLINE]
        if self._stalls and silent:
            # Time the controller stood still is not the nodes' silence: their reports may be
            # waiting, unread, in its own buffers.
            silent = [n for n in silent if n.last_seen_ms + self._stalled_since(n.last_seen_ms) < cutoff]
        for node in silent:
            heard = max(node.last_seen_ms, self._started_ms)
            node.state = UNREACHABLE
            self._presence_dirty.add(node.node_id)
            self._state_changed.add(node.node_id)
            self.presence_version += 1
            changed.append(node)
            log.warning("node_unreachable", node=node.node_id, silent_s=round((now - heard) / 1000, 1))
            self._notify_presence(node, ONLINE, UNREACHABLE)
        return changed

    def _note_lag(self, now: int) -> None:
        """Measure how late this sweep runs; a stall (a starved process, a long pause) is remembered
        for one heartbeat timeout, so nodes silent only while the controller was are not called down."""
        if self._last_sweep_ms is not None:
            late = now - self._last_sweep_ms - self._sweep_ms
            self.lag_ms = max(0, late)
            self.metrics.lag.set(self.lag_ms / 1000)
            if late > max(self._sweep_ms, 1000):
                self._stalls.append((now, late))
                log.warning("controller_lagging", lag_s=round(late / 1000, 1))
        self._last_sweep_ms = now
        if self._stalls:
            horizon = now - 2 * self.heartbeat_timeout_ms
            self._stalls = [s for s in self._stalls if s[0] >= horizon]

    def _stalled_since(self, since_ms: int) -> int:
        """Milliseconds the controller stood still after ``since_ms``."""
        return sum(lost for resumed, lost in self._stalls if resumed > since_ms)

    def flush_presence(self, force: bool = False) -> None:
        """Persist last-seen and state for nodes touched since the last flush, in one transaction.

        Runs every sweep. Nodes whose state changed are written at once; last-seen times once
        they are ``last_seen_flush_s`` old, at most ``PRESENCE_ROWS_PER_FLUSH`` a sweep (the
        rest on the following sweeps); everything when forced (shutdown). The write runs on the
        event loop, so it is kept to a chunk (Store.update_presence keeps each row small).
        """
        if not self._presence_dirty:
            return
        now = self._clock_ms()
        if force:
            chosen = list(self._presence_dirty)
        else:
            chosen = list(self._state_changed)
            if now - self._flushed_ms >= self._last_seen_flush_ms:
                rest = (nid for nid in self._presence_dirty if nid not in self._state_changed)
                chosen.extend(itertools.islice(rest, PRESENCE_ROWS_PER_FLUSH))
            if not chosen:
                return
        changed = None if force else set(self._state_changed)
        self._state_changed.clear()
        self._presence_dirty.difference_update(chosen)
        if not self._presence_dirty or force:
            self._flushed_ms = now  # drained: the next last-seen round is due in last_seen_flush_s
        rows = [(nid, self.nodes[nid].state, self.nodes[nid].last_seen_ms) for nid in chosen if nid in self.nodes]
        self.store.update_presence(rows, changed)

    def _notify_presence(self, node: NodeRecord, old: str, new: str) -> None:
        for listener in self.listeners:
            try:
                listener.on_presence(node, old, new)
            except Exception:
                log.exception("listener_failed", hook="on_presence", node=node.node_id)

    def _count_not_judged(self) -> int:
        return sum(1 for node in self.nodes.values() if node.not_judged_why)

    def _count_state(self, state: str) -> int:
        return sum(1 for node in self.nodes.values() if node.state == state)

    def push_probe_plan(self, node_id: str, plan: spb.ProbePlan) -> None:
        """The node's new part of the probe mesh: sent on its stream now, or when it connects."""
        node = self.nodes.get(node_id)
        if node is None:
            return
        node.probe_plan = plan
        if node.stream_wake is not None:
            node.stream_wake.set()

    # -- commands --------------------------------------------------------------------
    def send_command(self, node_id: str, command: spb.Command) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            raise UnknownNode(f"no node {node_id!r}")
        node.commands.put_nowait(command)
        self.metrics.command_queue.inc()

    async def run_command(self, node_id: str, command: spb.Command, timeout_s: float) -> spb.CommandResult | None:
        """Send a command and wait (at most ``timeout_s`` on the registry's clock) for the agent's answer.

        None when none came in time: the node is gone, rebooting, or the command hangs. A
        controller that restarts forgets the waiter; whoever asked plans the step and asks again.
        """
        waiter: asyncio.Future[spb.CommandResult] = asyncio.get_running_loop().create_future()
        self._command_waiters[command.id] = waiter
        try:
            self.send_command(node_id, command)
            return await self.clock.wait_for(waiter, timeout_s)
        except (TimeoutError, UnknownNode):
            return None
        finally:
            self._command_waiters.pop(command.id, None)

    def boot_id(self, node_id: str) -> str:
        """The node's boot id from its last Hello ("" when unknown): a reboot changes it."""
        node = self.nodes.get(node_id)
        return node.boot_id if node is not None else ""

    def has_nvswitch(self, node_id: str) -> bool:
        """An HGX-style board (8 GPUs, every one with NVLinks): its GPUs sit behind NVSwitches
        and NVIDIA resets them only all together. The inventory names no switch, so this is
        read from the GPUs' links."""
        node = self.nodes.get(node_id)
        gpus = list(node.inventory.gpus) if node is not None else []
        return len(gpus) >= 8 and all(g.nvlink_count > 0 for g in gpus)

    def command_result(self, node: NodeRecord, result: spb.CommandResult) -> None:
        """An agent answered a command: wake whoever waits for it (the servicer calls this)."""
        waiter = self._command_waiters.get(result.id)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)


def _iso(ms: int) -> str:
    """A stamp with its date (UTC): a clock a day off reads as the same time of day otherwise."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (not a date)"
