"""The decision core: everything the controller decides, on an injected clock, with no gRPC.

``DecisionCore`` composes ingest's node registry, detection (conditions, fail-slow,
correlation and the grouping task it owns), the job registry and, with healing on, the
healer (policy, guards, spares, the repair ladder). Every part reads the one clock it is
handed and waits on it, so a ``FakeClock`` drives hours of decisions in milliseconds.

Entry points, each the one way in for its input (docs/architecture.md):

- ``hello(msg)``: a node registers (its stream opened); returns its record.
- ``report(node_id, report)``: a report, decided by detection once (``Detection.decide``);
  its verdict is recorded by the registry, which hands it back here (``on_report``) for
  the job registry's per-rank samples.
- ``events(node_id, events)``: a batch of events, stored, then to detection once.
- ``job_progress(job, step, at_ms, phase)``: a job's own word on its progress (the
  scheduler's or launcher's), besides the per-rank samples reports carry; a final phase
  (``completed``, ``cancelled``, ``failed``) ends the job in the fleet ledger.
- ``tick()``: one periodic sweep: presence, then detection's tick (expiry, fail-slow,
  grouping); ``start()``/``stop()`` run it, the grouping task and the healer as tasks.

The controller service (controller.service) builds one and puts gRPC and HTTP in front of
it: its streams call ``hello`` through the registry and hand reports to ``detection`` (the
ReportDecider), whose verdicts they record and ack. A fleet simulator calls the entry
points directly.

Job-level verdicts (a hang: a job whose step stops moving) are decided on this floor, above
the job registry that holds the steps; detection sits below jobs (the "Controller floors"
import contract) and cannot read it. Such a verdict reaches the correlator as condition
changes through ``Detection.feed``, like a stepwise fail-slow evaluation's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence

import structlog

from controller.detect.agent_conflict import AgentConflicts
from controller.detect.model import ConditionChange, Incident
from controller.detect.pipeline import Detection, IncidentListener
from controller.detect.rules import load_rules
from controller.detect.shard_worker import ShardSettings
from controller.fabric import Fabric
from controller.heal.guards import Guards
from controller.heal.healer import Healer
from controller.heal.inservice import FleetServiceLedger, retired_nodes
from controller.heal.policy import Policy, SqliteHealHistory, load_policy
from controller.heal.repair import RepairConfig, RepairLoop
from controller.heal.spares import SparePool
from controller.heal.states import AUTOMATIC, RemediationStore
from controller.ingest.registry import NodeRecord, NodeRegistry
from controller.ingest.verdict import ReportResult
from controller.jobs.hang import HangDetector
from controller.jobs.registry import JobRegistry
from controller.jobs.stacks import RankStack, group_stacks, hardware_on, rank_stacks
from controller.jobs.stall import GpuStallDetector
from controller.mesh import ProbeMesh
from controller.metrics import ControllerMetrics
from controller.query.history import HistoryKeeper
from controller.settings import ControllerConfig, HealSettings
from controller.stages import StageTracker
from controller.store import Store
from starpulse.core import sdnotify
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)
HISTORY_SWEEP_MS = 3_600_000  # the retention sweep's period: days leave the horizon one at a time
# A retirement (RMA) closes its node's service interval within this long: the GPU-days are
# counted in days, and walking every node each sweep held the loop ~17 ms at 10,000 nodes.
FLEET_SERVICE_RESYNC_MS = 60_000


class DecisionCore:
    """Registry, detection, jobs and healing, built together; see the module docstring."""

    def __init__(
        self,
        config: ControllerConfig,
        clock: Clock,
        store: Store,
        metrics: ControllerMetrics,
        *,
        fabric: Fabric | None = None,
        allowed_nodes: Sequence[str] | None = None,
        stages: StageTracker | None = None,
        incident_listeners: Sequence[IncidentListener] = (),
        on_shard_lost: Callable[[int], None] = lambda index: None,
    ) -> None:
        """``incident_listeners``: who hears incident changes before the healer (alerts).

        ``fabric``/``allowed_nodes``: the declared fabric and the node ids that may register
        (None: any). ``on_shard_lost``: a detection shard process ended.
        """
        self.config = config
        self.clock = clock
        self.store = store
        self.metrics = metrics
        self.fabric = fabric
        self.registry = NodeRegistry(
            store,
            metrics,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            allowed_nodes=allowed_nodes,
            clock=clock,
            listeners=[self],
            stages=stages,
            on_takeover=self._taken_over,
            sweep_interval_s=config.sweep_interval_s,
        )
        self.conflicts = AgentConflicts(clock)
        self.jobs = JobRegistry(store.connection, clock)
        self.fleet_service = FleetServiceLedger(store.connection)  # the GPU-days of the fleet report
        self.history = HistoryKeeper(store.connection, config.history_retention_s, config.aggregate_retention_s)
        self._history_due_ms = 0
        self._fleet_synced: tuple[int, int] | None = None  # (registry presence version, when)
        for job, nodes in config.jobs.items():
            self.jobs.register_job(job, nodes)
        self.hangs = HangDetector(config.hang, clock)
        self.stalls = GpuStallDetector(config.stall, clock)
        self._stack_tasks: set[asyncio.Task[None]] = set()
        # The healer reads detection's incidents through late-bound callables: it is built first
        # so that detection is built with every incident listener it has.
        self.healer = self._build_healer(config.heal) if config.heal is not None else None
        self.detection = Detection(
            store.connection,
            load_rules(config.rules_path),
            fabric,
            metrics,
            config.detection,
            jobs_of=self.jobs.jobs_of,
            first_jobs=self.jobs.first_job_by_node,
            fleet_size=self.fleet_size,
            clock=clock,
            listeners=[*incident_listeners, *([self.healer] if self.healer is not None else [])],
            stages=stages,
            sweep_s=config.sweep_interval_s,
            failslow_stepwise=True,  # the sweep loop runs it in steps between reports
            shard_settings=ShardSettings(
                rules_path=str(config.rules_path) if config.rules_path is not None else None,
                failslow=config.detection.failslow,
                tick_s=config.sweep_interval_s,
            ),
            on_shard_lost=on_shard_lost,
            node_of=self.registry.nodes.get,
        )
        # Without ingest's servicer in front (a simulator), verdicts are recorded here; the
        # service's TelemetryServicer binds itself instead (it acks them too).
        self.detection.bind(self._record)
        if self.detection.shards is not None:
            shards = self.detection.shards
            metrics.set_shard_sources(lambda: len(shards.running()), lambda: shards.in_flight)
        # The probe mesh (issue 29): planned from the fabric, pushed on the streams, replanned on change.
        self.mesh: ProbeMesh | None = None
        if fabric is not None and config.detection.probes.enabled:
            self.mesh = ProbeMesh(
                fabric,
                config.detection.probes,
                self.registry,
                busy_nodes=lambda: self.jobs.first_job_by_node().keys(),  # one pass, not jobs_of per node
                clock=clock,
                on_planned=lambda plan: metrics.probe_mesh_targets.set(sum(len(t) for t in plan.targets.values())),
            )
        # The sweep's steps, in order, each timed (starpulse_periodic_seconds{step}).
        self._periodic: list[tuple[str, Callable[[], object]]] = [
            ("heartbeat_sweep", self.registry.sweep),
            ("presence_flush", self.registry.flush_presence),
            ("detection_tick", self.detection.tick),
            ("agent_conflicts", self._conflicts_tick),
            ("hang_check", self.check_hangs),
            ("fleet_service", self.sync_fleet_service),
            ("history", self.sweep_history),
        ]
        if self.mesh is not None:
            self._periodic.append(("probe_mesh", self.mesh.tick))
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._heal_task: asyncio.Task[None] | None = None

    # -- healing --------------------------------------------------------------------------
    def _build_healer(self, settings: HealSettings) -> Healer:
        store = RemediationStore(self.store.connection, self.clock)  # the spares' clock too
        guards = Guards(settings.guards, store, self.store.connection, self.clock)
        policy = load_policy(settings.policy_path)
        spares = (
            SparePool(self.fabric, lambda node: self._spare_healthy(node, policy), store)
            if self.fabric is not None
            else None
        )
        repairs = RepairLoop(
            policy.repair,
            store,
            settings.scheduler,
            self.registry,
            open_incidents=self.open_incidents,
            conditions_clear=self._conditions_clear,
            resolve=lambda incident_id, why, since: self.detection.correlator.resolve_on_evidence(
                incident_id, why, AUTOMATIC, since
            ),
            spares=spares,
            clock=self.clock,
            config=RepairConfig(poll_s=settings.heal.repair_poll_s),
            holds_node=policy.holds,
            not_judged=self._not_judged_why,
        )
        if spares is not None:
            self.metrics.set_spare_sources(spares.counts, repairs.spare_target)
        return Healer(
            policy,
            guards,
            store,
            SqliteHealHistory(store, self.clock),
            spares,
            settings.scheduler,
            self.jobs,
            self.registry,
            self.metrics,
            fleet_size=self.fleet_size,
            open_incidents=self.open_incidents,
            config=settings.heal,
            clock=self.clock,
            repairs=repairs,
            incident_now=lambda incident_id: self.detection.correlator.get(incident_id),  # noqa: PLW0108 (late-bound: detection is built after the healer)
        )

    def _not_judged_why(self, node: str) -> str:
        """Why ``node``'s accelerators were not read ("" when they were or no agent said)."""
        record = self.registry.nodes.get(node)
        return record.not_judged_why if record is not None else ""

    def _conditions_clear(self, incident_id: str, since_ms: int | None) -> bool:
        return self.detection.correlator.conditions_clear(incident_id, since_ms)

    def open_incidents(self) -> list[Incident]:
        """Every open incident (the healer's and the repair loop's view)."""
        return self.detection.correlator.incidents(active_only=True, limit=100_000)

    def _spare_healthy(self, node: str, policy: Policy) -> bool:
        """A spare is usable when its agent is heard and no open incident holds it (one that
        blames it and that the policy acts on: not a switch fault it only sits under)."""
        record = self.registry.nodes.get(node)
        if record is None or record.state != "online":
            return False
        if record.not_judged_why:  # never a spare whose accelerators were not read (issue 30)
            return False
        return not any(policy.holds(i, node) for i in self.detection.correlator.incidents(active_only=True))

    def sync_fleet_service(self) -> None:
        """Open a ``fleet_service`` interval for every compute node heard, close retired nodes'.

        Runs in full when the registry changed (a node registered or changed presence) or a
        minute has passed (a retirement), not on every sweep.
        """
        now = self.clock.time_ms()
        version = self.registry.presence_version
        if self._fleet_synced is not None:
            synced_version, synced_ms = self._fleet_synced
            if synced_version == version and now - synced_ms < FLEET_SERVICE_RESYNC_MS:
                return
        self._fleet_synced = (version, now)
        nodes = {
            n.node_id: (len(n.inventory.gpus), n.first_seen_ms)
            for n in self.registry.nodes.values()
            if n.role == ipb.NODE_ROLE_COMPUTE
        }
        self.fleet_service.sync(nodes, retired_nodes(self.store.connection), now)

    def sweep_history(self) -> None:
        """Keep the database bounded: aggregate and delete what left the horizon, once an hour."""
        now = self.clock.time_ms()
        if now >= self._history_due_ms:
            self._history_due_ms = now + HISTORY_SWEEP_MS
            self.history.sweep(now)  # aggregates the days leaving the horizon first: ended jobs' too
            self.jobs.forget_ended(self.history.cutoff(now))

    def fleet_size(self) -> int:
        if self.fabric is not None:
            return len(self.fabric.nodes())
        return sum(1 for n in self.registry.nodes.values() if n.role == ipb.NODE_ROLE_COMPUTE)

    # -- entry points ---------------------------------------------------------------------
    def hello(self, hello: spb.Hello) -> NodeRecord:
        """A node registers: its record (UnknownNode/ValueError as the registry raises them)."""
        return self.registry.register(hello)

    def report(self, node_id: str, report: tpb.Report) -> None:
        """One report, decided once by detection; its verdict goes to whoever is bound (here: recorded)."""
        node = self.registry.nodes[node_id]
        self.detection.decide(node, spb.AgentMessage(report=report), time.perf_counter())

    def events(self, node_id: str, events: list[tpb.Event]) -> list[tpb.Event]:
        """A batch of events: stored, then to detection once; returns the ones that were new."""
        return self.registry.record_events(self.registry.nodes[node_id], events)

    def job_progress(self, job: str, step: int, at_ms: int, phase: str = "") -> None:
        """A job's own progress (its launcher or scheduler), besides the per-rank report samples;
        a final phase (``completed``, ``cancelled``, ``failed``) ends the job: its figures are final."""
        self.jobs.progress(job, step, at_ms, phase)

    def feed(self, changes: list[ConditionChange]) -> None:
        """Condition changes decided on this floor (a job-level verdict): to the correlator."""
        self.detection.feed(changes)

    def check_hangs(self) -> None:
        """Every ``hang.every_s``: judge each job's progress; verdicts to the correlator (``feed``).

        A job-level verdict, so decided here on the core's floor from the job registry (the
        hang detector lives on the jobs floor, above detection).
        """
        if not self.hangs.due():
            return
        changes = self.hangs.evaluate(self.jobs.live()) + self.stalls.evaluate()
        if changes:
            for change in changes:
                if change.kind == "opened":
                    ev = change.condition.evidence
                    self.metrics.job_hangs_total.labels(str(ev.get("shape", "")), str(ev.get("source", ""))).inc()
                    self._collect_stacks_soon(str(ev["job"]), [str(n) for n in ev.get("nodes", [])])
            self.feed(changes)
            self.metrics.job_hangs_open.set(len({c.component for c in self.hangs.active() + self.stalls.active()}))

    def _collect_stacks_soon(self, job: str, nodes: list[str]) -> None:
        """Ask every node of a hung job for its ranks' stacks, as a task (none without a running loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.collect_stacks(job, nodes))
        self._stack_tasks.add(task)
        task.add_done_callback(self._stack_tasks.discard)

    async def collect_stacks(self, job: str, nodes: list[str]) -> None:
        """COLLECT_STACKS to each node of ``job``; the stacks grouped (controller.jobs.stacks), the
        outliers named on the hang's condition, which goes to the correlator as an update."""
        started = self.clock.monotonic()
        timeout_s = self.config.hang.stacks_timeout_s
        results = await asyncio.gather(
            *(
                self.registry.run_command(
                    node,
                    spb.Command(id=f"stacks:{job}:{node}:{self.clock.time_ms()}", kind=spb.COMMAND_KIND_COLLECT_STACKS,
                                args={"job": job}),
                    timeout_s,
                )
                for node in nodes
            )
        )  # fmt: skip
        stacks: list[RankStack] = []
        for node, result in zip(nodes, results, strict=True):
            if result is None:
                log.warning("job_hang_stacks_unanswered", job=job, node=node)
                continue
            if not result.payload_json:
                log.info("job_hang_stacks_none", job=job, node=node, message=result.message)
                continue
            try:
                payload = json.loads(result.payload_json)
            except ValueError:
                log.warning("job_hang_stacks_bad_payload", job=job, node=node)
                continue
            if isinstance(payload, dict):
                stacks += rank_stacks(node, payload)
        verdict = group_stacks(stacks)
        cond = next((c for c in self.hangs.active() + self.stalls.active() if c.evidence.get("job") == job), None)
        named = {o.node for o in verdict.outliers} or set(cond.evidence.get("suspect_nodes", []) if cond else [])
        verdict.hardware = hardware_on(named, self.open_incidents())
        self.metrics.job_hang_culprit_seconds.observe(self.clock.monotonic() - started)
        changes = self.hangs.annotate(job, verdict) + self.stalls.annotate(job, verdict)
        if changes:
            self.feed(changes)

    def tick(self) -> None:
        """One periodic sweep: each step in order, timed; then a fail-slow comparison when due."""
        self._sweep_steps()
        if self.detection.failslow_due():
            changes: list[ConditionChange] = []
            for _ in self.detection.failslow.evaluation_steps(changes):
                pass
            self.detection.feed(changes)

    def _conflicts_tick(self) -> None:
        changes = self.conflicts.tick()
        if changes:
            self.detection.feed(changes)

    def _taken_over(self, node: NodeRecord, old_peer: str, new_peer: str) -> None:
        """A foreign stream took a node over: a second one within the window is an agent_conflict."""
        changes = self.conflicts.takeover(node.node_id, old_peer, new_peer)
        if changes:
            self.detection.feed(changes)

    def _record(self, verdict: ReportResult) -> None:
        node = self.registry.nodes.get(verdict.node_id)
        if node is not None and not verdict.error:
            self.registry.record_report(node, verdict)

    # -- IngestListener (controller.ingest.registry): what the registry recorded ----------
    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        """A recorded report: detection has it already (it decided it); the job registry takes its ranks,
        the GPU-signature hang detector its jobs' GPUs (with the NIC rate, when fail-slow sampled one)."""
        self.jobs.on_report(node, verdict)
        if verdict.job_gpus:
            self.stalls.observe(node.node_id, verdict.job_gpus, verdict.signals.get("nic_gbps"))
        if verdict.lldp is not None and self.mesh is not None:
            self.mesh.changed()  # learned wiring may have moved a cable

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        self.detection.on_events(node, events)

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        self.detection.on_presence(node, old_state, new_state)
        if self.mesh is not None:
            self.mesh.changed()

    # -- life -----------------------------------------------------------------------------
    async def start_shards(self) -> None:
        """Detection's shard processes (before ingest opens: no report may bypass them)."""
        await self.detection.start()

    def start(self) -> None:
        """The sweep loop, the grouping task and the healer, as tasks on the running loop."""
        self._stop.clear()
        self._tasks = [
            asyncio.create_task(self._sweep_loop()),
            asyncio.create_task(self.detection.grouping.run()),
        ]
        if self.healer is not None:
            self._heal_task = asyncio.create_task(self.healer.run(self._stop))

    async def stop(self) -> None:
        """Periodic tasks cancelled; the healer finishes its current step; shards end last."""
        for task in [*self._tasks, *self._stack_tasks]:  # stack collections in flight end too
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def stop_healing(self) -> None:
        """The healer finishes its current step (a remediation in progress) and stops."""
        self._stop.set()
        if self._heal_task is not None:
            await self._heal_task
            self._heal_task = None

    async def stop_shards(self) -> None:
        await self.detection.stop()

    async def _sweep_loop(self) -> None:
        watchdog = sdnotify.Watchdog()  # WATCHDOG=1 every half WatchdogSec= while sweeps keep running
        if self.mesh is not None:
            self.mesh.offload = True  # the loop's own sweep: the mesh plans beside it (controller/mesh.py)
        while True:
            await self.clock.sleep(self.config.sweep_interval_s)
            self._sweep_steps()
            if self.detection.failslow_due():
                await self._failslow_evaluation()
            watchdog.kick()

    def _sweep_steps(self) -> None:
        at = time.thread_time()
        for step, run in self._periodic:
            started = time.perf_counter()
            try:
                run()
            except Exception:
                log.exception("periodic_step_failed", step=step)
            self.metrics.periodic_seconds.labels(step).observe(time.perf_counter() - started)
        self.metrics.stage_cpu.since("periodic", at)  # the report path's split (bench.scale) names it too

    async def _failslow_evaluation(self) -> None:
        """One fail-slow peer comparison in steps of ~500 nodes, reports decided in between.

        In one piece it held the event loop ~150 ms at 10,000 nodes (bench.failslow_eval).
        """
        changes: list[ConditionChange] = []
        steps = self.detection.failslow.evaluation_steps(changes)
        observe = self.metrics.periodic_seconds.labels("failslow_step").observe
        finished = False
        while not finished:
            started = time.perf_counter()
            at = time.thread_time()
            try:
                next(steps)
            except StopIteration:
                finished = True  # the last step applied the verdicts
            except Exception:
                log.exception("periodic_step_failed", step="failslow_step")
                return
            observe(time.perf_counter() - started)
            self.metrics.stage_cpu.since("failslow", at)
            if not finished:
                await asyncio.sleep(0)
        try:
            self.detection.feed(changes)
        except Exception:
            log.exception("periodic_step_failed", step="failslow_feed")
