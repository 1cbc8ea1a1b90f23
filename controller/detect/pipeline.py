"""Detection: the one way into condition finding, fail-slow, topology and correlation.

Runs on the controller's event loop. Each input enters here once:

1. a report: ``decide`` (ingest's ReportDecider, controller.ingest.decider). A compute
   node's report goes to its detection shard when there are shards, else the rules run
   here; either way its verdict comes back through ``_decided``, which folds the report's
   fail-slow signals, cadence and LLDP in, then hands the verdict to ingest's sink;
2. a batch of events: ``on_events`` (to the node's shard, or the engine here);
3. a presence change: ``on_presence``;
4. condition changes found elsewhere (a shard's engine, a stepwise fail-slow evaluation,
   a job-level verdict of the decision core): ``feed_shard_changes`` / ``feed``;

then every change goes ``_feed`` -> the correlator, the grouping task (owned here) groups
when a window closes (``group``), and each incident change goes to the listeners handed
in at construction (alerts, healing). ``tick`` expires, runs fail-slow when due and groups.
Everything per report is dictionary work; grouping and fail-slow run on their own clocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog
from google.protobuf.message import DecodeError

from controller.detect.conditions import ConditionEngine, nic_fabric_evidence
from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from controller.detect.gpu_jobs import job_gpu_signature
from controller.detect.grouping import GroupingWindows, ReportCadence
from controller.detect.grouping_task import GroupingTask
from controller.detect.incidents import IncidentStore
from controller.detect.model import ConditionChange, Incident
from controller.detect.probe_rounds import localise_in_shards, send_fabric
from controller.detect.probes import Blame, ProbeLocaliser, observations
from controller.detect.rules import RuleSet
from controller.detect.shard_worker import ShardSettings
from controller.detect.shards import DetectShards
from controller.detect.switch_witness import SwitchPortWitness
from controller.fabric import Fabric
from controller.fabric.probeplan import ProbeConfig
from controller.fabric.topology import TopologyTracker
from controller.ingest.registry import NodeRecord
from controller.ingest.validate import InvalidMessage, validate_report
from controller.ingest.verdict import ReportResult
from controller.metrics import ControllerMetrics
from controller.stages import StageTracker
from starpulse.core.clock import Clock
from starpulse.core.schema import setting
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

if TYPE_CHECKING:
    from controller.detect.shard_worker import EventsOpened

log = structlog.get_logger(__name__)
_COMPUTE = ipb.NODE_ROLE_COMPUTE
_SWITCH = ipb.NODE_ROLE_SWITCH


@dataclass
class DetectionConfig:
    correlation: CorrelationConfig = field(default_factory=CorrelationConfig)
    failslow: FailSlowConfig = field(default_factory=FailSlowConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
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


class Detection:
    """Built with everything it needs; nothing is assigned to it after construction."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        rules: RuleSet,
        fabric: Fabric | None,
        metrics: ControllerMetrics,
        config: DetectionConfig | None = None,
        jobs_of: Callable[[str], list[str]] = lambda node: [],
        fleet_size: Callable[[], int] | None = None,
        *,
        clock: Clock,
        listeners: Sequence[IncidentListener] = (),
        stages: StageTracker | None = None,
        sweep_s: float = 1.0,
        failslow_stepwise: bool = False,
        shard_settings: ShardSettings | None = None,
        on_shard_lost: Callable[[int], None] = lambda index: None,
        node_of: Callable[[str], NodeRecord | None] = lambda node_id: None,
        first_jobs: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """``listeners``: who hears incident changes, in order (alerts, then healing).

        ``sweep_s``: the periodic tick's interval (a grouping window waits at most one more).
        ``failslow_stepwise``: the controller runs fail-slow evaluations in steps between
        reports (failslow_due, then FailSlowDetector.evaluation_steps and feed); tick leaves
        them out. ``shard_settings``: with ``config.workers`` > 0, compute nodes' reports and
        events are decided in that many shard processes (``start`` starts them);
        ``on_shard_lost`` hears one end. ``node_of``: the registry's record of a node, for a
        shard's verdict that brings new LLDP neighbours. ``first_jobs``: node -> its first job
        (``jobs_of(node)[0]`` for every node at once, JobRegistry.first_job_by_node); given, the
        fail-slow peer groups come from one map per evaluation, not ``jobs_of`` per node.
        """
        self.config = config or DetectionConfig()
        self.clock = clock
        self.fabric = fabric
        self.metrics = metrics
        self.jobs_of = jobs_of
        self.engine = ConditionEngine(rules, fabric, clock=clock)
        self._block_map: tuple[object, dict[str, str]] | None = None  # (the fabric's block index, node -> group)
        group_map: Callable[[], Mapping[str, str]] | None = None
        if first_jobs is not None:
            jobs_map = first_jobs  # bound for the closure: mypy keeps the narrowing

            def group_map() -> dict[str, str]:
                return self._peer_groups(jobs_map)

        self.failslow = FailSlowDetector(
            self.config.failslow, group_of=self._peer_group, clock=clock, group_map=group_map
        )
        self.incidents = IncidentStore(conn)
        corr = self.config.correlation
        # the fleet's measured report interval: shared conditions' window
        self.cadence = ReportCadence(now=clock.monotonic)
        self.windows = GroupingWindows(corr, self.cadence.interval_s, sweep_s=sweep_s)
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
        # Incidents open when their conditions' grouping windows close, not on the next tick:
        # woken whenever a condition starts waiting (_feed), run by the controller (grouping.run).
        self.grouping = GroupingTask(self.correlator.next_due_ms, self.group, clock)
        self.topology = TopologyTracker(fabric, clock=clock)
        self.listeners: list[IncidentListener] = list(listeners)
        self.stages = stages  # per-stage latency: condition and incident marks
        self._last_failslow = clock.monotonic()  # the fail-slow cadence (failslow_due)
        self._node_of = node_of
        self._verdicts: Callable[[ReportResult], None] = _unbound
        self._full_seen: dict[str, int] = {}  # node -> the stream token whose stream sent a full report
        self.failslow_stepwise = failslow_stepwise
        # With detection shards compute nodes' reports and events are evaluated there; this
        # engine keeps presence (heartbeats) and switches.
        self.shards: DetectShards | None = None
        probing = fabric is not None and self.config.probes.enabled
        if self.config.workers > 0 and shard_settings is not None:
            if probing:  # each shard keeps its own nodes' probe window (controller.detect.probe_sums)
                shard_settings = dataclasses.replace(shard_settings, probes=self.config.probes, fabric=fabric)
            self.shards = DetectShards(
                self.config.workers,
                shard_settings,
                on_changes=self.feed_shard_changes,
                on_lost=on_shard_lost,
                cpu=metrics.stage_cpu,
                shard_cpu=metrics.shard_stage_cpu,
                now_ms=clock.time_ms,
            )
        # The probe mesh's localisation (controller.detect.probes): the one place that votes with the
        # whole fabric. Its window is held here without shards, in the shards with them (each its own
        # nodes' results, summed where they are decoded), and merged per component when it localises.
        self.probes: ProbeLocaliser | None = None
        self.probe_localising: asyncio.Task[None] | None = None  # with shards: the localisation under way
        self._wiring_sent = 0  # the topology's rewirings the shards' copies of the fabric follow
        if fabric is not None and self.config.probes.enabled:
            self.probes = ProbeLocaliser(
                fabric, self.config.probes, clock=clock, node_ok=self._probe_node_ok, local=self.shards is None
            )
        self._refresh_gauges()

    def _probe_node_ok(self, node_id: str, since_ms: int) -> bool:
        """A node whose probe results count: online and connected, its prober running since before
        ``since_ms`` (one that restarted within the window lost probes to its restart, not to the
        network; a mere reconnect, as after a controller restart or failover, is not a restart:
        ``controller.ingest.registry.prober_since``), and heard within one and a half report
        intervals (one gone quiet may be restarting right now)."""
        rec = self._node_of(node_id)
        if rec is None or rec.state != "online" or not rec.connected or rec.probes_since_ms > since_ms:
            return False
        interval = self.cadence.interval_s() or 5.0
        return self.clock.time_ms() - rec.last_seen_ms <= 1500 * interval

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

    def _peer_groups(self, first_jobs: Callable[[], Mapping[str, str]]) -> dict[str, str]:
        """``_peer_group`` for every node at once (only nodes with a group): one pass over the
        jobs and the fabric's blocks per fail-slow evaluation instead of two lookups per node."""
        out = dict(self._fabric_blocks())
        for node, job in first_jobs().items():
            out[node] = f"job:{job}"
        return out

    def _fabric_blocks(self) -> dict[str, str]:
        """Compute node -> ``block:<n>``, rebuilt only when the fabric's block index is another object."""
        fabric = self.fabric
        if fabric is None:
            return {}
        index = fabric.blocks_index()
        if self._block_map is None or self._block_map[0] is not index:
            blocks = {node: f"block:{block}" for block, nodes in index.items() for node in nodes}
            self._block_map = (index, blocks)
        return self._block_map[1]

    # -- 1. a report (ReportDecider, controller.ingest.decider) ---------------------------
    def bind(self, on_verdict: Callable[[ReportResult], None]) -> None:
        """Where verdicts go (ingest's TelemetryServicer, or the decision core without one)."""
        self._verdicts = on_verdict
        if self.shards is not None:
            self.shards.bind(self._decided)

    def decide(self, node: NodeRecord, message: spb.AgentMessage, started: float) -> None:
        """Decide a valid report (here, or a compute node's in its shard) and hand its verdict on."""
        if self.shards is not None and node.role == _COMPUTE:
            self.shards.decide(node, message, started)  # the verdict comes back to _decided
            return
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
            job_gpus = job_gpu_signature(report)
        except Exception:
            # A bug in a rule must not lose the report: it is still recorded and acked (a
            # shard does the same, controller.detect.shard_worker).
            log.exception("report_decision_failed", node=nid)
            signals, job, job_gpus = {}, None, {}
        self._fold(node, signals, job, report.timestamp_ms, lldp)
        if self.probes is not None and report.probe_results:
            self.probes.add(nid, observations(report))
            self.metrics.probe_results.inc(len(report.probe_results))
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
                job_gpus=job_gpus,
                lldp=lldp,
                gpus=len(report.gpus),
                nics=len(report.nics),
                switch_ports=len(report.switch_ports),
                report=report,
                accelerator_check=report.accelerator_check if report.HasField("accelerator_check") else None,
            )
        )

    def decide_raw(self, node: NodeRecord, agent_message: bytes, started: float) -> bool:
        """A relayed report's bytes: decoded and validated here, then decided; False when they are not one."""
        if self.shards is not None and node.role == _COMPUTE:
            return self.shards.decide_raw(node, agent_message, started)  # its shard decodes them
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
        """True while too many reports wait in the shards (never without them: decided at once)."""
        return self.shards is not None and self.shards.full

    async def room(self) -> None:
        if self.shards is not None:
            await self.shards.room()

    def _decided(self, verdict: ReportResult) -> None:
        """A shard's verdict: its fail-slow signals, cadence and LLDP folded in here, then on to ingest."""
        if not verdict.error:
            node = self._node_of(verdict.node_id)
            if node is not None:  # one ingest no longer knows is not recorded either
                if verdict.lldp is not None:
                    node.lldp = verdict.lldp
                self._fold(node, verdict.signals, verdict.job, verdict.timestamp_ms, verdict.lldp)
                if verdict.probe_count:  # summed in the shard, asked for when the localiser runs
                    self.metrics.probe_results.inc(verdict.probe_count)
        self._verdicts(verdict)

    def _fold(
        self,
        node: NodeRecord,
        signals: dict[str, float],
        job: str | None,
        timestamp_ms: int,
        lldp: list[ipb.LldpNeighbor] | None,
    ) -> None:
        """What a decided report gives beyond its conditions: fail-slow samples, cadence, topology."""
        try:
            self.failslow.append(node.node_id, signals, job)
            if timestamp_ms:
                self.cadence.saw(node.node_id, timestamp_ms)
            if lldp is not None:
                self.topology.update(node)
                if self.probes is not None:
                    self.probes.forget_paths()  # learned wiring may have moved a cable under a path
        except Exception:
            log.exception("report_fold_failed", node=node.node_id)

    # -- 2. a batch of events, 3. presence (IngestListener, via the decision core) ---------
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
        if self.correlator.next_due_ms() is not None:
            self.grouping.wake()

    # -- 5. the periodic tick, then grouping ---------------------------------------------
    async def start(self) -> None:
        """Start the shards (before ingest opens: no report may bypass them)."""
        if self.shards is not None:
            await self.shards.start()

    async def stop(self) -> None:
        """Stop the shards: what they were handed is decided first."""
        if self.probe_localising is not None and not self.probe_localising.done():
            self.probe_localising.cancel()
        if self.shards is not None:
            await self.shards.stop()

    def tick(self) -> list[tuple[str, Incident]]:
        """Expire conditions, run fail-slow when due, group, and publish incident changes."""
        changes = self.engine.tick()
        if not self.failslow_stepwise and self.failslow_due():
            changes += self.failslow.evaluate()
        if self.probes is not None and self.probes.due():
            if self.shards is not None:
                self._localise_in_shards(self.probes, self.shards)
            else:
                try:
                    changes += self._probe_conditions(self.probes, self.probes.localise())
                except Exception:
                    log.exception("probe_localisation_failed")
        self._feed(changes)
        self.topology.tick()
        return self.group()

    def _probe_conditions(self, probes: ProbeLocaliser, blames: list[Blame]) -> list[ConditionChange]:
        """A localisation's blames into conditions, and its gauges."""
        changes = probes.conditions(blames)
        self.metrics.probe_loss.clear()
        for b in probes.last_blames:
            self.metrics.probe_loss.labels(b.component, b.kind).set(round(b.rate, 5))
        self.metrics.probe_background_loss.set(probes.background_loss or 0.0)
        return changes

    def _localise_in_shards(self, probes: ProbeLocaliser, shards: DetectShards) -> None:
        """Start a localisation of the window the shards hold (one at a time: a slow one skips a turn)."""
        if self.probe_localising is not None and not self.probe_localising.done():
            log.warning("probe_localisation_skipped", reason="the previous one is still running")
            return
        if self.fabric is not None and self.topology.rewirings != self._wiring_sent:
            self._wiring_sent = self.topology.rewirings
            send_fabric(shards, self.fabric)

        async def localise() -> None:
            try:
                blames = await localise_in_shards(probes, shards)
                self._feed(self._probe_conditions(probes, blames))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("probe_localisation_failed")

        self.probe_localising = asyncio.get_running_loop().create_task(localise())

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
        """Condition changes found outside detection's own inputs: a stepwise fail-slow
        evaluation, or a job-level verdict of the decision core (controller.core)."""
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
