"""Detection wired to ingest: conditions from every report, event and presence change,
fail-slow peer comparison, correlation into incidents on the fabric.

Runs on the controller's event loop. ``Detection`` is ingest's in-process report decider
(controller.ingest.decider: it decides a report during the hand-over and answers with its
verdict) and a registry listener (events, presence, and every decided report's fail-slow
signals and LLDP, whether it decided the report or a shard did). Everything per report is
dictionary work; grouping and fail-slow run on the periodic tick, not per message.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog
from google.protobuf.message import DecodeError

from controller.detect.conditions import ConditionEngine, nic_fabric_evidence
from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from controller.detect.grouping import GroupingWindows, ReportCadence
from controller.detect.incidents import IncidentStore
from controller.detect.model import ConditionChange, Incident
from controller.detect.rules import RuleSet
from controller.detect.switch_witness import SwitchPortWitness
from controller.fabric import Fabric
from controller.fabric.topology import TopologyTracker
from controller.ingest.registry import NodeRecord
from controller.ingest.validate import InvalidMessage, validate_report
from controller.ingest.verdict import ReportResult
from controller.metrics import ControllerMetrics
from controller.stages import StageTracker
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.core.schema import setting
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

if TYPE_CHECKING:
    from controller.detect.shard_worker import EventsOpened
    from controller.detect.shards import DetectShards

log = structlog.get_logger(__name__)
_COMPUTE = ipb.NODE_ROLE_COMPUTE
_SWITCH = ipb.NODE_ROLE_SWITCH


@dataclass
class DetectionConfig:
    correlation: CorrelationConfig = field(default_factory=CorrelationConfig)
    failslow: FailSlowConfig = field(default_factory=FailSlowConfig)
    failslow_every_s: float = setting(
        5.0, "Seconds between fail-slow peer comparisons; each one looks at a whole window", gt=0
    )
    workers: int = setting(
        0,
        "Processes that evaluate compute nodes' reports and events (detection shards); 0: all detection "
        "in the controller's process, enough for ~4,000-6,000 nodes reporting every 5 s",
        ge=0,
        le=64,
    )


class IncidentListener(Protocol):
    """Alerts, healing and the dashboard subscribe to incident changes here."""

    def on_incident(self, change: str, incident: Incident) -> None: ...


def _unbound(verdict: ReportResult) -> None:
    raise RuntimeError("Detection.decide before bind(): the TelemetryServicer binds its verdict sink")


def incident_to_dict(incident: Incident) -> dict[str, object]:
    out = asdict(incident)
    out["condition_keys"] = [list(k) for k in incident.condition_keys]
    return out


class Detection:
    def __init__(
        self,
        conn: sqlite3.Connection,
        rules: RuleSet,
        fabric: Fabric | None,
        metrics: ControllerMetrics,
        config: DetectionConfig | None = None,
        jobs_of: Callable[[str], list[str]] = lambda node: [],
        fleet_size: Callable[[], int] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config or DetectionConfig()
        self.clock = clock
        self.fabric = fabric
        self.metrics = metrics
        self.jobs_of = jobs_of
        self.engine = ConditionEngine(rules, fabric, clock=clock)
        self.failslow = FailSlowDetector(self.config.failslow, group_of=self._peer_group, clock=clock)
        self.incidents = IncidentStore(conn)
        corr = self.config.correlation
        self.cadence = ReportCadence()  # the fleet's measured report interval: shared conditions' window
        self.windows = GroupingWindows(corr, self.cadence.interval_s)
        self.switch_ports = SwitchPortWitness()  # switches' own word on their ports: a clean leaf is not blamed
        self.correlator = Correlator(
            fabric,
            self.incidents,
            corr,
            jobs_of=jobs_of,
            fleet_size=fleet_size,
            clock=clock,
            window_ms=self.windows.window_ms,
            port_clean=self.switch_ports.clean_since,
        )
        # Called when a condition starts waiting for its grouping window: the controller's
        # grouping task wakes and groups it when the window closes, not on the next tick.
        self.on_pending: Callable[[], None] | None = None
        self.topology = TopologyTracker(fabric, clock=clock)
        self.listeners: list[IncidentListener] = []
        self.stages: StageTracker | None = None  # per-stage latency: condition and incident marks
        self._last_failslow = clock.monotonic()  # the fail-slow cadence (failslow_due)
        # With detection shards (controller.detect.shards) compute nodes' reports and events are
        # evaluated there; this engine keeps presence (heartbeats) and switches.
        self.shards: DetectShards | None = None
        self._verdicts: Callable[[ReportResult], None] = _unbound
        self._full_seen: dict[str, int] = {}  # node -> the stream token whose stream sent a full report
        # True: the controller runs fail-slow evaluations in steps between reports
        # (failslow_due, then FailSlowDetector.evaluation_steps and feed); tick leaves them out.
        self.failslow_stepwise = False
        self._refresh_gauges()

    def _peer_group(self, node: str) -> str | None:
        """Fail-slow peers: the node's job, else its block (pod) in the fabric."""
        jobs = self.jobs_of(node)
        if jobs:
            return f"job:{jobs[0]}"
        if self.fabric is not None:
            try:
                return f"block:{self.fabric.block_of(node)}"
            except KeyError:
                return None
        return None

    # -- ReportDecider (controller.ingest.decider): decided during the hand-over ----------
    def bind(self, on_verdict: Callable[[ReportResult], None]) -> None:
        self._verdicts = on_verdict

    def decide(self, node: NodeRecord, message: spb.AgentMessage, started: float) -> None:
        """Run the rules on a valid report and hand its verdict to ingest at once."""
        report = message.report
        nid, token = node.node_id, node.stream_token
        lldp = None
        if report.HasField("lldp"):
            lldp = node.lldp = list(report.lldp.neighbors)  # before the rules: NIC names follow LLDP
        if not report.counters_delta:
            self._full_seen[nid] = token
            full_needed = False
        else:
            full_needed = self._full_seen.get(nid) != token  # still used: absent counters read as unchanged
        try:
            if node.role == _SWITCH and report.switch_ports:
                self.switch_ports.saw(nid, report.switch_ports, self.clock.time_ms())
            self._feed(self.engine.on_report(node, report))
            signals, job = self.failslow.extract(nid, report) if node.role == _COMPUTE else ({}, None)
        except Exception:
            # A bug in a rule must not lose the report: it is still recorded and acked (a
            # shard does the same, controller.detect.shard_worker).
            log.exception("report_decision_failed", node=nid)
            signals, job = {}, None
        self._verdicts(
            ReportResult(
                node_id=nid,
                stream_token=token,
                submitted=started,
                seq=report.seq,
                timestamp_ms=report.timestamp_ms,
                full_report_needed=full_needed,
                signals=signals,
                job=job,
                job_steps=report.job_steps,
                lldp=lldp,
                gpus=len(report.gpus),
                nics=len(report.nics),
                switch_ports=len(report.switch_ports),
                report=report,
            )
        )

    def decide_raw(self, node: NodeRecord, agent_message: bytes, started: float) -> bool:
        """A relayed report's bytes: decoded and validated here, then decided; False when they are not one."""
        try:
            message = spb.AgentMessage.FromString(agent_message)
            if message.WhichOneof("body") != "report":
                return False
            validate_report(message.report)
        except (DecodeError, InvalidMessage):
            return False  # the stream reads the bytes again and ends with the right status
        self.decide(node, message, started)
        return True

    @property
    def full(self) -> bool:
        return False  # deciding during the hand-over leaves nothing waiting

    async def room(self) -> None:
        return None

    # -- IngestListener -------------------------------------------------------------------
    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        """A decided report (here or in a shard): its fail-slow signals join the peer comparison here."""
        self.failslow.append(node.node_id, verdict.signals, verdict.job)
        if verdict.timestamp_ms:
            self.cadence.saw(node.node_id, verdict.timestamp_ms)
        if verdict.lldp is not None:
            self.topology.update(node)

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        if self.shards is not None and node.role == _COMPUTE:
            self.shards.submit_events(node, events)  # the engine that holds the node's conditions
            return
        changes = self.engine.on_events(node, events)
        opened = [ch.condition.key for ch in changes if ch.kind == "opened"]
        if self.stages is not None:
            self.stages.conditions_opened(node.node_id, [ev.seq for ev in events], opened)
        self._feed_after_events(changes, opened)

    def feed_shard_changes(self, changes: list[ConditionChange], opened: list[EventsOpened] | None = None) -> None:
        """Condition changes from a shard's engine, completed with what only the fabric knows.

        ``opened``: what the frame's batches of events opened, and when (in the shard): traced
        and given the event window exactly as events this engine takes (on_events).
        """
        if self.fabric is not None:
            for change in changes:
                cond = change.condition
                if cond.component_type == "nic":
                    cond.evidence.update(nic_fabric_evidence(self.fabric, cond.component))
        keys = []
        for batch in opened or ():
            keys += batch.keys
            if self.stages is not None:
                self.stages.conditions_opened(batch.node, batch.seqs, batch.keys, at=batch.at)
        self._feed_after_events(changes, keys)

    def _feed_after_events(self, changes: list[ConditionChange], by_event: list[tuple[str, str]]) -> None:
        """Feed changes among which ``by_event`` were opened by events: their siblings are events too."""
        self.windows.by_event.update(by_event)  # the short window, asked for during the feed
        try:
            self._feed(changes)
        finally:
            self.windows.by_event.clear()  # an owned condition was not asked: no stale mark stays

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        if old_state == new_state:
            return
        self._feed(self.engine.on_presence(node, old_state, new_state))
        if new_state == "online" and node.lldp:
            self.topology.update(node)

    def _feed(self, changes: list[ConditionChange]) -> None:
        if not changes:
            return
        for change in changes:
            c = change.condition
            log.info(
                "condition_" + change.kind,
                rule=c.rule,
                component=c.component,
                severity=c.severity,
                count=c.count,
                message=c.message,
            )
        self.correlator.on_changes(changes)
        if self.on_pending is not None and self.correlator.next_due_ms() is not None:
            self.on_pending()

    # -- periodic -------------------------------------------------------------------------
    def tick(self) -> list[tuple[str, Incident]]:
        """Expire conditions, run fail-slow when due, group, and publish incident changes."""
        changes = self.engine.tick()
        if not self.failslow_stepwise and self.failslow_due():
            changes += self.failslow.evaluate()
        self._feed(changes)
        self.topology.tick()
        return self.group()

    def group(self) -> list[tuple[str, Incident]]:
        """Group the conditions whose windows closed and publish incident changes (tick, or the grouping task)."""
        published = self.correlator.tick()
        for change, incident in published:
            log.warning(
                "incident_" + change,
                id=incident.id,
                kind=incident.kind,
                root_cause=incident.root_cause,
                component_type=incident.component_type,
                affected_nodes=len(incident.affected_nodes),
                severity=incident.severity,
                action=incident.action,
            )
            if change == "opened" and self.stages is not None:
                self.stages.incident_opened(incident.id, incident.condition_keys)
            if change == "opened" and incident.condition_keys:
                first = min((e.get("first_seen_ms", incident.opened_ms) for e in incident.evidence), default=0)
                if first:
                    self.metrics.detection_seconds.observe(max(0.0, (incident.opened_ms - int(first)) / 1000))
            for listener in self.listeners:
                try:
                    listener.on_incident(change, incident)
                except Exception:
                    log.exception("incident_listener_failed", id=incident.id)
        if published:
            self._refresh_gauges()
        return published

    def failslow_due(self) -> bool:
        """True once every failslow_every_s (and the clock starts over): time for a peer comparison."""
        now = self.clock.monotonic()
        if now - self._last_failslow < self.config.failslow_every_s:
            return False
        self._last_failslow = now
        return True

    def feed(self, changes: list[ConditionChange]) -> None:
        """Condition changes found outside tick (a stepwise fail-slow evaluation)."""
        self._feed(changes)

    def _refresh_gauges(self) -> None:
        counts: dict[str, int] = {}
        for inc in self.correlator.incidents(active_only=True, limit=100_000):
            counts[inc.kind] = counts.get(inc.kind, 0) + 1
        self.metrics.incidents_open.clear()
        for kind, n in counts.items():
            self.metrics.incidents_open.labels(kind).set(n)

    def forget(self, node_id: str) -> None:
        if self.shards is not None:
            self.shards.forget(node_id)  # what the shard resolves comes back through feed_shard_changes
        self._full_seen.pop(node_id, None)
        self.cadence.forget(node_id)
        self.switch_ports.forget(node_id)
        self._feed(self.engine.forget(node_id))
        change = self.failslow.forget(node_id)
        if change is not None:
            self._feed([change])
        self.topology.forget(node_id)


def evidence_json(incident: Incident) -> str:
    return json.dumps(incident.evidence, sort_keys=True, default=str)
