"""The fleet simulator: months of faults through the controller's own decision code, in seconds.

What is the controller's: a ``DecisionCore`` built from the same settings and policy files
the controller takes, on a ``FakeClock``. A fault becomes condition changes fed to detection
(``DecisionCore.feed``, with the rule ids, categories and actions of the rules file); the
correlator groups them on the fabric into an incident (SQLite, as live); the healer decides
it (policy, guards and breaker, the state machine, the spare pool, the scheduler's drain and
requeue, the job registry, the repair ladder: its rungs, their limits and the validation's checks
are the policy's, each answer goes to the repair loop as its drive loop takes it
(``RepairLoop.rung_result``, ``validation_failed``: the next rung, or RMA), and a repair ends
through the repair loop's own return (``RepairLoop.finish``: resume, spare or back in service,
incident resolved).
The scheduler is the in-memory ``SimScheduler``: its placement decides whether a job restarts
on a spare at once or waits for capacity.

What is the simulator's: the fault process (Poisson, rates and causes from the mix), the agents'
times on each rung, which rung puts each cause right and the hardware repair times (from the
mix's ``ladder:`` and causes, sourced or labelled assumptions), and each job's time accounting
(checkpoint every Δt of compute taking w; a failure loses the work since the last complete
checkpoint; a restart costs u0 once the job has its nodes). The clock jumps from event to
event: nothing waits on real time, no gRPC, no agents.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from controller.core import DecisionCore
from controller.detect.model import ComponentType, Condition, ConditionChange, Rule
from controller.detect.rules import load_rules
from controller.fabric import Fabric, generate_fabric
from controller.heal.healer import Healer
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import NodeHealState
from controller.metrics import ControllerMetrics
from controller.query.fleet import fleet_report
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.app.fleetsim.mix import FIXES, Cause, Mix
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)
S = NodeHealState
DAY_S = 86400.0
START_MS = 1_700_000_000_000
COMMAND_DRAIN_EVERY = 256  # publishes between two emptyings of the nodes' command queues (_drain_commands)


@dataclass(frozen=True)
class JobSpec:
    """A training job: its nodes, checkpoint interval Δt and write time w, restart overhead u0 (seconds)."""

    name: str
    nodes: int
    checkpoint_interval_s: float = 1800.0
    checkpoint_write_s: float = 60.0
    restart_overhead_s: float = 600.0


@dataclass(frozen=True)
class SimSettings:
    """One simulated run. ``nodes``: working nodes (jobs fill them in order); ``spares``: idle ones."""

    nodes: int
    spares: int
    days: float
    jobs: tuple[JobSpec, ...]
    gpus_per_node: int = 8
    seed: int = 1
    rate_scale: float = 1.0  # multiplies the mix's rates
    planned: bool = True  # draw the mix's planned interruptions too
    manual_s: float = 3600.0  # assumption: a person acts on a refused eviction or an open breaker this much later
    step_time_s: float = 10.0  # what the jobs' ranks report as their step time (the registry's samples)


@dataclass(frozen=True, order=True)
class Fault:
    """One fault of a trace: at ``at_s`` after the start, on ``node``, of mix cause ``cause``."""

    at_s: float
    node: str
    cause: str


@dataclass
class _Job:
    spec: JobSpec
    start_s: float = 0.0
    running_since: float | None = 0.0  # None: down
    saved_s: float = 0.0  # compute saved by complete checkpoints
    down_since: float = 0.0
    interruptions: int = 0
    waited_s: float = 0.0  # down and waiting for nodes (no capacity)
    waiting_since: float | None = None
    lost_s: float = 0.0  # compute lost (since the last complete checkpoint)
    restart_at: float | None = None
    runs: int = 0

    def interrupt(self, now: float) -> bool:
        """The job fails at ``now``; False if it was already down."""
        if self.running_since is None or now < self.running_since:
            if self.running_since is not None and now < self.running_since:
                # failed during its restart: the restart is lost, nothing else
                self.running_since, self.down_since = None, now
                self.interruptions += 1
                return True
            return False
        saved, lost = self._progress(now - self.running_since)
        self.saved_s += saved
        self.lost_s += lost
        self.running_since, self.down_since = None, now
        self.interruptions += 1
        return True

    def _progress(self, elapsed: float) -> tuple[float, float]:
        """(compute saved by complete checkpoints, compute since the last one) after ``elapsed`` of running."""
        dt, w = self.spec.checkpoint_interval_s, self.spec.checkpoint_write_s
        cycles = math.floor(elapsed / (dt + w))
        partial = elapsed - cycles * (dt + w)
        return cycles * dt, min(partial, dt)

    def finish(self, end: float) -> None:
        if self.running_since is not None and end > self.running_since:
            saved, partial = self._progress(end - self.running_since)
            self.saved_s += saved + partial  # work since the last checkpoint is progress when the run ends
        if self.waiting_since is not None:
            self.waited_s += end - self.waiting_since

    def ettr(self, end: float) -> float:
        return self.saved_s / (end - self.start_s) if end > self.start_s else 0.0


@dataclass
class SimResult:
    settings: SimSettings
    wall_s: float  # real seconds the run took
    faults: Counter[str] = field(default_factory=Counter)  # by the report's cause
    interruptions: Counter[str] = field(default_factory=Counter)  # job interruptions by cause
    jobs: dict[str, dict[str, float]] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the healer's, in order
    evictions: int = 0
    spares_used: int = 0
    evictions_without_spare: int = 0
    breaker_trips: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)  # the ladder's outcomes: "after reboot", "retired"...
    report: dict[str, Any] = field(default_factory=dict)  # controller.query.fleet on the run's database
    db_bytes: int = 0

    @property
    def ettr(self) -> float:
        """GPU-weighted over jobs."""
        weight = sum(j["gpus"] for j in self.jobs.values())
        return sum(j["ettr"] * j["gpus"] for j in self.jobs.values()) / weight if weight else 0.0

    @property
    def capacity_wait_share(self) -> float:
        """Share of the jobs' wall time spent down waiting for nodes (GPU-weighted)."""
        weight = sum(j["gpus"] * j["wall_s"] for j in self.jobs.values())
        return sum(j["gpus"] * j["waited_s"] for j in self.jobs.values()) / weight if weight else 0.0

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        mttr = self.report.get("mttr", {})
        return {
            "settings": {
                "nodes": s.nodes, "spares": s.spares, "gpus_per_node": s.gpus_per_node, "days": s.days,
                "seed": s.seed, "rate_scale": s.rate_scale, "planned": s.planned, "manual_s": s.manual_s,
                "jobs": [j.__dict__ for j in s.jobs],
            },
            "ettr": self.ettr,
            "capacity_wait_share": self.capacity_wait_share,
            "jobs": self.jobs,
            "faults_by_cause": dict(self.faults),
            "faults_per_1000_gpu_days": self.report.get("faults", {}).get("per_1000_gpu_days"),
            "interruptions_by_cause": dict(self.interruptions),
            "mttr_node_back_in_pool_s": mttr.get("fault_to_node_back_in_pool", {}).get("mean_s"),
            "evictions": self.evictions,
            "spares_used": self.spares_used,
            "evictions_without_spare": self.evictions_without_spare,
            "breaker_trips": self.breaker_trips,
            "refused": dict(self.refused),
            "repairs": dict(self.repairs),
            "wall_s": self.wall_s,
            "db_bytes": self.db_bytes,
        }  # fmt: skip


def draw_faults(mix: Mix, settings: SimSettings, nodes: Sequence[str]) -> list[Fault]:
    """A Poisson trace of the mix's unplanned faults (and planned interruptions) on ``nodes``."""
    rng = random.Random(settings.seed)
    gpus = len(nodes) * settings.gpus_per_node
    horizon = settings.days * DAY_S
    out: list[Fault] = []
    weights = [c.count for c in mix.causes]
    streams: list[tuple[float, list[str] | None]] = [(mix.rate_per_gpu_day() * gpus * settings.rate_scale, None)]
    if settings.planned and mix.planned:
        streams.append((mix.rate_per_gpu_day(planned=True) * gpus * settings.rate_scale, ["planned"]))
    for per_day, fixed in streams:
        t = 0.0
        while per_day > 0:
            t += rng.expovariate(per_day / DAY_S)
            if t >= horizon:
                break
            cause = fixed[0] if fixed else rng.choices(mix.causes, weights)[0].name
            out.append(Fault(t, rng.choice(nodes), cause))
    return sorted(out)


class FleetSim:
    """One simulated fleet on a DecisionCore; ``run(trace)`` plays a trace of faults through it."""

    def __init__(
        self,
        settings: SimSettings,
        mix: Mix,
        base: ControllerConfig | None = None,
        db_path: Path | None = None,
    ) -> None:
        """``base``: the controller's settings (``--config``; its heal section's guards, heal
        timings and policy file are used, its scheduler replaced by the simulated one)."""
        self.settings = settings
        self.mix = mix
        self.causes = {c.name: c for c in mix.causes}
        base = base or ControllerConfig()
        heal = base.heal
        self.fabric = sim_fabric(settings)
        self.scheduler = SimScheduler(list(self.fabric.nodes()))
        working = [n for n in self.fabric.nodes() if not self.fabric.is_spare(n)]
        self.jobs: dict[str, _Job] = {}
        at = 0
        for spec in settings.jobs:
            if at + spec.nodes > len(working):
                raise ValueError(f"jobs need {at + spec.nodes} nodes, the fleet has {len(working)} working nodes")
            self.scheduler.add_job(spec.name, working[at : at + spec.nodes])
            self.jobs[spec.name] = _Job(spec)
            at += spec.nodes
        self._tmp = tempfile.TemporaryDirectory(prefix="starpulse-sim-") if db_path is None else None
        self.db_path = db_path or Path(self._tmp.name if self._tmp else ".") / "sim.db"
        config = replace(
            base,
            db_path=self.db_path,
            fabric=self.fabric,
            heartbeat_timeout_s=10 * 365 * DAY_S,  # presence is not simulated: no sweep runs
            jobs={},
            heal=HealSettings(
                self.scheduler,
                policy_path=heal.policy_path if heal else None,
                guards=heal.guards if heal else HealSettings(self.scheduler).guards,
                heal=replace(heal.heal if heal else HealSettings(self.scheduler).heal, checkpoint_timeout_s=0.0),
            ),
        )
        self.clock = FakeClock(start_ms=START_MS)
        self.store = Store(self.db_path)
        self.core = DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)
        assert self.core.healer is not None and self.core.healer.repairs is not None
        self.healer: Healer = self.core.healer
        self.rules = {r.id: r for r in load_rules(config.rules_path).rules}
        self.settle_s = config.detection.correlation.settle_s
        inventory = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(settings.gpus_per_node)])
        for node in self.fabric.nodes():
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inventory, boot_id="b"))
        for name, job in self.scheduler.jobs.items():
            self.core.jobs.register_job(name, job.nodes, world_size=len(job.nodes) * settings.gpus_per_node)
        self.core.sync_fleet_service()
        self._events: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._publishes = 0
        self._open: dict[str, list[Condition]] = {}  # node -> its fault's conditions (to resolve at repair)
        # the repair ladder played (the mix's ``ladder:``): what will put each node's fault right,
        # its cause (the hardware repair's time), and the nodes put on a rung since last looked
        self._fix: dict[str, str] = {}
        self._cause_of: dict[str, Cause] = {}
        self._entered: list[str] = []
        self._fix_rng = random.Random(f"fixes-{settings.seed}")
        self.result = SimResult(settings, 0.0)

    # -- the event loop ---------------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, payload))

    def now_s(self) -> float:
        return (self.clock.time_ms() - START_MS) / 1000.0

    def _jump(self, t: float) -> None:
        if t > self.now_s():
            self.clock.set_ms(START_MS + int(t * 1000))

    async def run(self, trace: Iterable[Fault]) -> SimResult:
        import time

        started = time.perf_counter()
        for fault in trace:
            self._at(fault.at_s, "fault", fault)
        end = self.settings.days * DAY_S
        while self._events and self._events[0][0] < end:
            t, _, kind, payload = heapq.heappop(self._events)
            self._jump(t)
            if kind == "fault":
                await self._fault(payload)
            elif kind == "repaired":
                await self._repaired(*payload)
            elif kind == "resolve":
                await self._resolve(payload)
                self._uncordon(payload)
            elif kind == "restart":
                self._restart(payload)
            elif kind == "breaker_reset":
                self.healer.guards.breaker.reset("simulated-operator", "reset after a look (simulator)")
            elif kind == "rung_done":
                self._rung_done(*payload)
            elif kind == "validated":
                await self._validated(*payload)
            elif kind == "validation_failed":
                self._validation_failed(*payload)
            self._start_entered()
        self._jump(end)
        self._finish(end, time.perf_counter() - started)
        return self.result

    # -- a fault ----------------------------------------------------------------------------------
    async def _fault(self, fault: Fault) -> None:
        now = self.now_s()
        state = self.healer.store.state(fault.node)
        if state not in (S.IN_SERVICE, S.SPARE, S.SUSPECT):
            return  # out of service already: the node is not running anything to fail
        if fault.cause == "planned":
            self._planned(fault.node, now)
            return
        cause = self.causes[fault.cause]
        self.result.faults[cause.cause] += 1
        jobs = list(self.scheduler.nodes[fault.node].jobs)
        for job in jobs:
            if self.jobs[job].interrupt(now):
                self.result.interruptions[cause.cause] += 1
        if cause.rule is None:  # the job fails by itself: it restarts on the same nodes
            for job in jobs:
                self._schedule_restart(job, now + self.jobs[job].spec.restart_overhead_s, "unrecorded")
            return
        conditions = fault_conditions(self.fabric, self.rules, cause, fault.node, self.clock.time_ms())
        self._open[fault.node] = conditions
        self._fix[fault.node], self._cause_of[fault.node] = self._draw_fix(cause), cause
        self.core.feed([ConditionChange("opened", c) for c in conditions])
        before, evictions = len(self.healer.decisions), len(self.healer.evictions)
        trips = len(self.healer.guards.breaker.log())
        await self._group_due()
        decided = self.healer.decisions[before:]
        if len(self.healer.guards.breaker.log()) > trips and self.healer.guards.breaker.is_open:
            self.result.breaker_trips += 1
            self._at(self.now_s() + self.settings.manual_s, "breaker_reset", None)
        evicted = [e for e in self.healer.evictions[evictions:] if not e.dry_run]
        for e in evicted:
            self.result.evictions += 1
            self.result.spares_used += e.replacement is not None
            self.result.evictions_without_spare += bool(e.jobs) and e.replacement is None
        for d in decided:
            if d["outcome"] not in ("ok", "forced", "alert_only", "already_out_of_service"):
                self.result.refused[d["outcome"]] += 1
        done = self.now_s()
        if evicted:
            for job in jobs:
                self._placed(job, done)
            self._repair_after(now, fault.node, cause, [e.node for e in evicted])
        else:
            refused = any(d["outcome"] not in ("alert_only", "already_out_of_service") for d in decided)
            delay = self.settings.manual_s if refused else 0.0  # a person takes the node out by hand
            reason = f"{decided[0]['kind']} on {fault.node}" if decided else "unrecorded"
            for job in jobs:
                self._schedule_restart(job, done + delay + self.jobs[job].spec.restart_overhead_s, reason)
            self._at(now + cause.repair_s, "resolve", fault.node)

    def _repair_after(self, now: float, node: str, cause: Cause, evicted: list[str]) -> None:
        """The evicted nodes' repair: the cause's repair time as a whole without a ladder in the mix;
        with one, the nodes on a rung are played from there (``_start_entered``), and a node the
        policy sent straight to RMA is out for the cause's hardware repair."""
        if self.mix.ladder is None:
            self._at(now + cause.repair_s, "repaired", (node, cause.name))
            return
        for out in evicted:
            if self.healer.store.state(out) == S.RETIRED:
                self.result.repairs["retired by the policy (RMA)"] += 1
                self._at(now + cause.repair_s, "repaired", (out, cause.name))

    def _planned(self, node: str, now: float) -> None:
        """Planned maintenance: the job checkpoints first (nothing lost) and restarts."""
        for job in self.scheduler.nodes[node].jobs:
            j = self.jobs[job]
            if j.running_since is None or now < j.running_since:
                continue
            saved, partial = j._progress(now - j.running_since)
            j.saved_s += saved + partial
            j.running_since, j.down_since = None, now
            j.interruptions += 1
            self.result.interruptions["planned"] += 1
            self._schedule_restart(job, now + j.spec.restart_overhead_s, "planned maintenance")

    def _uncordon(self, node: str) -> None:
        """A node the policy only cordoned goes back once its fault is fixed: a person's uncordon."""
        if self.healer.store.state(node) == S.CORDONED:
            self.healer.store.transition(node, S.IN_SERVICE, "fixed; uncordoned (simulated)", None, "operator")

    async def _group_due(self) -> None:
        """As detection's grouping task: at each pending condition's due time, group and publish,
        until nothing fed so far waits (a condition's window is the correlator's own)."""
        correlator = self.core.detection.correlator
        while (due := correlator.next_due_ms()) is not None:
            if due > self.clock.time_ms():
                self.clock.set_ms(due)
            await self._publish()

    async def _publish(self) -> None:
        """Group what waits, and let the healer hear every incident change now, as the live
        sweep (every second) and the healer's loop would before anything else happens."""
        self.core.detection.group()
        await self.healer.work_queued()
        assert self.healer.repairs is not None
        # its drive tasks do not run: the simulator plays the agents' round trips on the rungs itself
        self.healer.repairs.stop()
        for node in self.healer.store.nodes_in(S.EVICTED):
            # the drive loop's first step: onto the ladder's rung
            if self.healer.repairs.enter_rung(node) is not None and self.mix.ladder is not None:
                self._entered.append(node)
        self._publishes += 1
        if self._publishes % COMMAND_DRAIN_EVERY == 0:
            self._drain_commands()

    def _drain_commands(self) -> None:
        """Take off what the agents would take off their streams. Nothing in the decision code
        reads these queues back, so they are emptied every ``COMMAND_DRAIN_EVERY`` publishes
        rather than on each: a walk of every node per fault was the simulator's O(nodes) cost."""
        for record in self.core.registry.nodes.values():
            while not record.commands.empty():
                record.commands.get_nowait()

    async def _resolve(self, node: str) -> None:
        """The fault's conditions clear, and the correlator hears it once its window has passed."""
        conditions = self._open.pop(node, [])
        if conditions:
            now = self.clock.time_ms()
            for c in conditions:
                c.resolved_ms = now
            self.core.feed([ConditionChange("resolved", c) for c in conditions])
            await self._group_due()
            await self._publish()  # a resolved member updates its incident at once

    async def _repaired(self, node: str, cause: str) -> None:
        await self._resolve(node)
        repairs = self.healer.repairs
        assert repairs is not None
        record = self.healer.store.record(node)
        if record.state == S.RETIRED:  # back from RMA: a person sends it through validation again
            self.result.repairs["back from RMA"] += 1
            incident = self.core.detection.correlator.get(record.incident_id or "")
            self.healer.store.transition(node, S.REPAIRING, "back from RMA (simulated)", record.incident_id, "operator")
            if incident is not None:
                repairs.begin(node, incident, None)
        await repairs.finish(node, f"simulated repair of {cause}")
        await self._back(node)

    async def _back(self, node: str) -> None:
        """A node returned: the healer hears it, and jobs that waited for capacity may run."""
        self._fix.pop(node, None)
        await self._publish()
        now = self.now_s()
        for name, job in self.jobs.items():
            if job.waiting_since is not None:
                self._placed(name, now)

    # -- the repair ladder's agent round trips (the mix's ``ladder:``) -----------------------------
    def _draw_fix(self, cause: Cause) -> str:
        """What will put this fault right (a rung, or the hardware repair after the ladder's end)."""
        ladder = self.mix.ladder
        if ladder is None:
            return "hardware"
        table = cause.fixed_by or ladder.default_fixed_by
        return self._fix_rng.choices([f for f, _ in table], [p for _, p in table])[0]

    def _start_entered(self) -> None:
        while self._entered:
            self._next_rung(self._entered.pop(0))

    def _next_rung(self, node: str) -> None:
        """The node is on a rung (or retired): schedule the agent's answer, as long as it takes."""
        assert self.healer.repairs is not None and self.mix.ladder is not None
        state = self.healer.store.state(node)
        now = self.now_s()
        cause = self._cause_of.get(node)
        if state == S.RETIRED:  # the ladder's end: out for hardware repair (RMA) for the cause's time
            self.result.repairs["retired (RMA)"] += 1
            self._at(now + (cause.repair_s if cause else 0.0), "repaired", (node, cause.name if cause else "rma"))
            return
        rung = self.healer.repairs.current_rung(node) or "none"
        if state == S.VALIDATING:  # rung "none": validate only
            self._validate(node, rung)
            return
        if state != S.REPAIRING:
            return
        took = self.mix.ladder.rung_s.get(rung, 0.0)
        limit = self.healer.repairs.policy.timeout_s(rung)
        if took > limit:  # the agent does not answer within the rung's limit: the next rung
            self._at(now + limit, "rung_done", (node, rung, False, f"no answer within {limit:g}s"))
        else:
            self._at(now + took, "rung_done", (node, rung, True, f"{rung} done in {took:g}s (simulated agent)"))

    def _rung_done(self, node: str, rung: str, ok: bool, detail: str) -> None:
        assert self.healer.repairs is not None
        if self.healer.repairs.current_rung(node) != rung or not self.healer.repairs.rung_result(node, ok, detail):
            return  # stale: the node moved on meanwhile
        if ok:
            self._validate(node, rung)
        else:
            self._next_rung(node)

    def _validate(self, node: str, rung: str) -> None:
        """The validation after ``rung``: it passes once the fault is put right (the rung reaches
        what fixes it), taking the scan, the evidence's quiet time and each diagnostic's run; it
        fails when the fault is still there once the scan's wait for it to clear runs out."""
        assert self.healer.repairs is not None and self.mix.ladder is not None
        ladder = self.mix.ladder
        record = self.healer.repairs.repair(node)
        v = self.healer.repairs.policy.validation(record.kind if record else "default")
        now = self.now_s()
        if FIXES.index(rung) >= FIXES.index(self._fix.get(node, "none")):
            took = (ladder.scan_s if v.scan_clean else 0.0) + v.evidence_quiet_s
            took += sum(ladder.diagnostic_s.get(d.name, d.timeout_s) for d in v.diagnostics)
            self._at(now + took, "validated", (node, rung))
        elif v.scan_clean:
            why = f"the fault's conditions still active after {v.clear_within_s:g}s (simulated)"
            self._at(now + v.clear_within_s, "validation_failed", (node, rung, "scan", why))
        else:  # no scan: the fault shows again within the evidence's quiet time
            why = "the fault came back (simulated)"
            self._at(now + v.evidence_quiet_s, "validation_failed", (node, rung, "evidence_quiet", why))

    async def _validated(self, node: str, rung: str) -> None:
        repairs = self.healer.repairs
        assert repairs is not None
        if repairs.current_rung(node) != rung or self.healer.store.state(node) != S.VALIDATING:
            return
        await self._resolve(node)
        if await repairs.finish(node, f"validated after {rung} (simulated)"):
            self.result.repairs[f"returned after {rung}"] += 1
        await self._back(node)

    def _validation_failed(self, node: str, rung: str, step: str, why: str) -> None:
        assert self.healer.repairs is not None
        if self.healer.repairs.current_rung(node) != rung or not self.healer.repairs.validation_failed(node, step, why):
            return
        self._next_rung(node)

    # -- jobs -------------------------------------------------------------------------------------
    def _placed(self, name: str, now: float) -> None:
        """After a requeue or a node's return: the job restarts when the scheduler runs it."""
        job = self.jobs[name]
        placed = self.scheduler.jobs[name]
        if placed.state != "running":
            if job.waiting_since is None:
                job.waiting_since = now
            return
        if job.waiting_since is not None:
            job.waited_s += now - job.waiting_since
            job.waiting_since = None
        self.core.jobs.register_job(name, placed.nodes)
        self._schedule_restart(name, now + job.spec.restart_overhead_s, None)

    def _schedule_restart(self, name: str, at: float, reason: str | None) -> None:
        """Run the job again at ``at``; ``reason``: a restart the healer did not make, recorded
        as the live registry records it ("unrecorded": the job failed by itself)."""
        job = self.jobs[name]
        job.restart_at = at
        self._at(at, "restart", (name, reason))

    def _restart(self, payload: tuple[str, str | None]) -> None:
        name, reason = payload
        job = self.jobs[name]
        now = self.now_s()
        if job.restart_at is None or abs(job.restart_at - now) > 1e-3 or job.running_since is not None:
            return  # superseded by a later interruption
        placed = self.scheduler.jobs[name]
        if placed.state != "running" or not placed.nodes:
            return
        job.running_since, job.restart_at = now, None
        job.runs += 1
        down_ms = START_MS + int(job.down_since * 1000)
        if reason is not None and reason != "unrecorded":
            self.core.jobs.mark_interrupted(name, down_ms, reason)
        if reason is not None:
            self.core.jobs.mark_resumed(name, self.clock.time_ms(), 0)
        # the ranks come back: one rank's first step, as its node's report carries it
        sample = tpb.JobStepSample(job=name, rank=0, step=1, step_time_s=self.settings.step_time_s, pid=job.runs,
                                   world_size=job.spec.nodes * self.settings.gpus_per_node)  # fmt: skip
        self.core.report(
            placed.nodes[0], tpb.Report(seq=job.runs, timestamp_ms=self.clock.time_ms(), job_steps=[sample])
        )

    def _finish(self, end: float, wall_s: float) -> None:
        self._drain_commands()
        self.result.wall_s = wall_s
        self.result.decisions = list(self.healer.decisions)
        for name, job in self.jobs.items():
            job.finish(end)
            gpus = job.spec.nodes * self.settings.gpus_per_node
            self.result.jobs[name] = {
                "gpus": gpus,
                "ettr": job.ettr(end),
                "wall_s": end - job.start_s,
                "interruptions": job.interruptions,
                "lost_compute_s": job.lost_s,
                "waited_s": job.waited_s,
            }
        self.core.sync_fleet_service()
        self.result.report = fleet_report(self.store.connection, START_MS, self.clock.time_ms()).to_dict()

    def close(self) -> None:
        self.store.close()
        self.result.db_bytes = sum(p.stat().st_size for p in self.db_path.parent.glob(self.db_path.name + "*"))
        if self._tmp is not None:
            self._tmp.cleanup()


def fault_conditions(
    fabric: Fabric, rules: Mapping[str, Rule], cause: Cause, node: str, now_ms: int
) -> list[Condition]:
    """What detection would hold for one fault of ``cause`` on ``node``: the rule's category,
    severity and action; a cable's fault is both its ends (the NIC and the leaf's port)."""
    assert cause.rule is not None
    rule = rules.get(cause.rule)
    if rule is None:
        raise ValueError(f"mix cause {cause.name}: rule {cause.rule!r} is not in the rules file")
    rng = random.Random(f"{node}{now_ms}")
    nics = fabric.nics_of(node) or [f"{node}/nic-0"]
    nic = rng.choice(nics)
    gpu = rng.choice(fabric.gpus_of(node) or [f"{node}/gpu-0"])
    component, ctype = {"gpu": (gpu, "gpu"), "nic": (nic, "nic"), "cable": (nic, "nic"), "node": (node, "node")}[
        cause.component or "node"
    ]

    def cond(rule_id: str, comp: str, comp_type: ComponentType, category: str, on: str | None) -> Condition:
        r = rules.get(rule_id, rule)
        return Condition(rule=rule_id, component=comp, component_type=comp_type, category=category, node=on,
                         severity=r.severity, action=r.action, message=f"simulated {cause.name}",  # type: ignore[arg-type]
                         first_seen_ms=now_ms, last_seen_ms=now_ms)  # fmt: skip

    if cause.component == "cable":
        leaf, port = fabric.leaf_of(nic), fabric.port_of(nic)
        out = [cond("nic.port_down", nic, "nic", "nic_link", node)]
        if leaf and port:
            out.append(cond(cause.rule, f"{leaf}:{port}", "switch", "switch_port", None))
        return out
    return [cond(cause.rule, component, ctype, rule.category, node)]  # type: ignore[arg-type]


def sim_fabric(settings: SimSettings) -> Fabric:
    """The simulated fleet's fabric: ``nodes`` working nodes and ``spares`` spares, 8 rails at most."""
    rails = min(settings.gpus_per_node, 8)
    per_block = 32 if settings.nodes >= 64 else max(2, settings.nodes // 2)
    return generate_fabric(
        nodes=settings.nodes,
        gpus_per_node=settings.gpus_per_node,
        rails=rails,
        nodes_per_block=per_block,
        spines=rails,
        spares=settings.spares,
    )


def simulate(
    settings: SimSettings,
    mix: Mix,
    base: ControllerConfig | None = None,
    trace: Sequence[Fault] | None = None,
    db_path: Path | None = None,
) -> SimResult:
    """Build, run (a drawn trace unless one is given) and close one simulated fleet."""
    sim = FleetSim(settings, mix, base, db_path)
    try:
        faults = trace if trace is not None else draw_faults(mix, settings, list(sim.fabric.nodes()))
        result = asyncio.run(sim.run(faults))
    finally:
        sim.close()
    return result
