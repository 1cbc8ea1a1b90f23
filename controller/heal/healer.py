"""The remediation orchestrator: from an incident to a job running again on a healthy node.

For each incident the detection publishes: the policy decides (alert, cordon, evict,
reset, reboot, RMA), the guards allow it or not (budget, breaker, dry-run, approval,
cool-down), then the steps run in order, each planned in SQLite before it is performed
and marked done after, so a restarted controller finishes a half-done remediation
exactly once (scheduler actions are idempotent):

    checkpoint (when the node still works) -> drain in the scheduler -> pick a spare on
    the topology -> requeue the node's jobs away from it, onto the spare -> confirm the
    job resumed from its last complete checkpoint.

Switch, link and partition incidents never touch a node: the policy and the guards both
refuse, and this module checks once more before any scheduler call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.detect.model import Incident
from controller.heal.guards import Guards
from controller.heal.policy import Decision, HealHistory, Policy
from controller.heal.repair import RepairLoop
from controller.heal.scheduler.base import ActionResult, Scheduler
from controller.heal.spares import SpareError, SparePool
from controller.heal.states import AUTOMATIC, InvalidTransition, NodeHealState, RemediationStore
from controller.ingest.registry import NodeRegistry
from controller.jobs.registry import JobRegistry
from controller.metrics import ControllerMetrics
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.core.schema import setting
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)

S = NodeHealState


_RESTART_IN_PLACE = "job_hang: restart in place"  # the restart's reason in the job's history (what the cap counts)


@dataclass
class HealConfig:
    checkpoint_timeout_s: float = setting(
        30.0, "Seconds to wait for a requested checkpoint before evicting anyway", ge=0
    )
    action_retries: int = setting(5, "Retries of a temporarily failing scheduler action", ge=0)
    retry_delay_s: float = setting(2.0, "Seconds between those retries", ge=0)
    repair_poke_s: float = setting(
        5.0,
        "Seconds between looks for evicted nodes to repair (after a failover too); a repair itself "
        "takes minutes, so a few seconds' pickup costs nothing at 16 nodes or 16,000 GPUs",
        gt=0,
    )
    repair_poll_s: float = setting(
        2.0,
        "Seconds between looks at a repairing node: for a reboot's new boot id, and for its conditions "
        "to clear while it is validated. A reboot takes 5-15 minutes and reports come every few seconds, "
        "so 2 s adds nothing to a repair and costs one query per node in repair (a handful at 16,000 GPUs)",
        gt=0,
    )
    hang_restarts_in_place: int = setting(
        2,
        "Restarts in place of one hung job (no node named) within hang_restart_window_s before a person "
        "is called instead: a hang from a bug in the job recurs at the same step, and restarting it "
        "again only burns the fleet's time",
        ge=0,
    )
    hang_restart_window_s: float = setting(
        6 * 3600.0, "Seconds over which restarts in place of one job are counted against that cap", gt=0
    )


@dataclass
class Eviction:
    """One eviction, as the scenario verdict and `starpulse jobs` report it."""

    node: str
    incident: str
    at_ms: int
    replacement: str | None
    jobs: list[str] = field(default_factory=list)
    dry_run: bool = False
    placement: str = ""  # in words: where the jobs went (the scheduler's answer), or why no spare

    def describe(self) -> str:
        """One line for the demo and the logs: never a bare ``None`` where the spare would be."""
        if self.dry_run:
            return f"would evict {self.node} (dry run)"
        if not self.jobs:
            return f"evicted {self.node}: no job ran on it, no spare needed"
        jobs = ", ".join(self.jobs)
        if self.replacement:
            return f"evicted {self.node}, jobs [{jobs}] requeued onto spare {self.replacement}"
        return f"evicted {self.node}, jobs [{jobs}]: no spare free; {self.placement or 'requeued'}"


class Healer:
    """An IncidentListener: queues incidents and works them off in its own task."""

    def __init__(
        self,
        policy: Policy,
        guards: Guards,
        store: RemediationStore,
        history: HealHistory,
        spares: SparePool | None,
        scheduler: Scheduler,
        jobs: JobRegistry,
        registry: NodeRegistry,
        metrics: ControllerMetrics,
        fleet_size: Callable[[], int],
        open_incidents: Callable[[], list[Incident]],
        config: HealConfig | None = None,
        *,
        clock: Clock,
        repairs: RepairLoop | None = None,
    ) -> None:
        self.policy = policy
        self.guards = guards
        self.store = store
        self.history = history
        self.spares = spares
        self.scheduler = scheduler
        self.jobs = jobs
        self.registry = registry
        self.metrics = metrics
        self.fleet_size = fleet_size
        self.open_incidents = open_incidents
        self.config = config or HealConfig()
        self.repairs = repairs  # None: the node stays evicted / in repair until a person returns it
        self.clock = clock  # eviction times, retry and checkpoint waits
        self._clock_ms = self.clock.time_ms
        self._queue: asyncio.Queue[Incident] = asyncio.Queue()
        self.evictions: list[Eviction] = []
        self.decisions: list[dict[str, Any]] = []
        self._hang_seen: set[tuple[str, int]] = set()  # (incident, its hang's start) acted on by this run

    # -- IncidentListener ------------------------------------------------------------------
    def on_incident(self, change: str, incident: Incident) -> None:
        if change in ("opened", "updated"):
            self._queue.put_nowait(incident)

    # -- the loop ----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Finish what a previous run planned, then work incidents until stop."""
        await self._replay_planned()
        await self._resume_interrupted()
        poker = asyncio.create_task(self._poke_repairs(stop)) if self.repairs is not None else None
        try:
            await self._work(stop)
        finally:
            if poker is not None:
                poker.cancel()
            if self.repairs is not None:
                self.repairs.stop()

    async def _poke_repairs(self, stop: asyncio.Event) -> None:
        """Start (or continue, after a failover) every evicted node's repair, every few seconds."""
        assert self.repairs is not None
        while not stop.is_set():
            try:
                self.repairs.poke()
            except Exception:
                log.exception("repair_poke_failed")
            await self.clock.sleep(self.config.repair_poke_s)

    async def _work(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            getter = asyncio.create_task(self._queue.get())
            stopper = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if getter not in done:
                getter.cancel()
                break
            incident = getter.result()
            try:
                self.guards.observe(self.open_incidents(), self.fleet_size())
                self.metrics.breaker_open.labels("eviction").set(1 if self.guards.breaker.is_open else 0)
                await self.handle(incident)
            except Exception:
                log.exception("remediation_failed", incident=incident.id, kind=incident.kind)

    async def handle(self, incident: Incident) -> None:
        """Decide, guard, and act on one incident."""
        if incident.kind == "job_hang":
            await self._handle_hang(incident)
            return
        decision = self.policy.decide(incident, self.history)
        record = {"incident": incident.id, "kind": incident.kind, "action": decision.action, "node": decision.node}
        if not decision.touches_node or decision.node is None:
            self.decisions.append({**record, "outcome": "alert_only", "reason": decision.reason})
            return
        await self._carry_out(incident, decision, record)

    async def _handle_hang(self, incident: Incident) -> None:
        """A hung job cannot checkpoint: requeue it from its last complete checkpoint without the
        node(s) its evidence names (each through the guards and the repair ladder, a spare in its
        place), or restart it in place when the evidence names none, at most
        ``hang_restarts_in_place`` times in ``hang_restart_window_s`` before a person is called.

        Either verdict (the job library's, the GPU signature's) waits for the ranks' stacks: the
        controller asks for them as the verdict opens, and an update of the incident follows them,
        named or not (unanswered within ``hang.stacks_timeout_s``: "no stack could be read").
        """
        evidence = [e.get("evidence") or {} for e in incident.evidence]
        if not evidence or any("stacks" not in e for e in evidence):
            return  # the stacks' verdict is on its way
        job = str(evidence[0].get("job", ""))
        # One remediation per hang: a hang that recurs reopens the same incident with new conditions;
        # a second verdict joining the first (the GPU signature after the steps) is the same hang.
        active = [int(e.get("first_seen_ms") or 0) for e in incident.evidence if e.get("resolved_ms") is None]
        episode = (incident.id, min(active, default=0))
        if episode in self._hang_seen:
            return  # acted on (or held for a person) already
        rec = self.jobs.job(job)
        if rec is not None and rec.state != "running":
            return  # interrupted or restarting already: its hang ends with the old run
        self._hang_seen.add(episode)
        suspects = sorted({str(n) for e in evidence for n in e.get("suspect_nodes") or []})
        record = {"incident": incident.id, "kind": incident.kind, "job": job}
        if suspects:
            for node in suspects:
                decision = Decision(
                    "evict", False, f"job_hang of {job}: {node} named by its ranks' stacks or steps", node=node
                )
                await self._carry_out(incident, decision, {**record, "action": "evict", "node": node})
            return
        await self._restart_in_place(incident, job, record)

    async def _restart_in_place(self, incident: Incident, job: str, record: dict[str, Any]) -> None:
        """No node named: restart the job where it runs, from its last complete checkpoint.

        No node leaves service, so the eviction budget and the cool-down (per node) do not count
        it; the per-job cap does, and dry-run, manual mode and an open breaker hold it.
        """
        record = {**record, "action": "restart_in_place", "node": None}
        rec = self.jobs.job(job)
        if not job or rec is None:
            self.decisions.append({**record, "outcome": "alert_only", "reason": f"job {job!r} is not known"})
            return
        since = self._clock_ms() - int(self.config.hang_restart_window_s * 1000)
        done = sum(1 for h in rec.history if h.reason.startswith(_RESTART_IN_PLACE) and h.interrupted_ms >= since)
        mode = self.guards.config.mode
        held = None
        if done >= self.config.hang_restarts_in_place:
            held = ("restart_cap_reached", f"{job} restarted in place {done} time(s): calling a person")
        elif self.guards.breaker.is_open:
            held = ("breaker_open", "circuit breaker open")
        elif mode != "enforce":
            held = (mode, f"{mode} mode: would restart {job} in place")
        if held is not None:
            self.decisions.append({**record, "outcome": held[0], "reason": held[1]})
            log.warning("hang_restart_held", incident=incident.id, job=job, code=held[0], reason=held[1])
            return
        now = self._clock_ms()
        self.jobs.mark_interrupted(job, now, f"{_RESTART_IN_PLACE} ({incident.id})")
        result = await self._act(
            f"job:{job}", "restart_in_place", incident.id, lambda: self.scheduler.requeue(job, [], []), job=job
        )
        resumed_from = rec.last_complete_step
        self.jobs.mark_resumed(job, self._clock_ms(), resumed_from)
        self.decisions.append({**record, "outcome": "ok" if result.ok else "failed", "reason": result.detail})
        self.metrics.evictions.labels(incident.kind, "restart_in_place").inc()
        log.warning(
            "hang_restarted_in_place",
            incident=incident.id,
            job=job,
            resumed_from_step=resumed_from,
            restarts_in_place=done + 1,
            detail=result.detail,
        )

    async def _carry_out(self, incident: Incident, decision: Decision, record: dict[str, Any]) -> None:
        """The guards, then the action on ``decision.node`` (evict, cordon, with the follow-ups)."""
        assert decision.node is not None
        if decision.evicts and not vocab.may_evict(incident.kind):  # belt and braces: policy and guards refuse too
            log.error("refused_eviction_for_network_incident", incident=incident.id, kind=incident.kind)
            return
        node = decision.node
        current = self.store.state(node)
        if current in (S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING, S.RETIRED) or (
            current == S.CORDONED and not decision.evicts
        ):
            # Already out of service (an incident update, or a second incident on the node).
            self.decisions.append({**record, "outcome": "already_out_of_service", "reason": str(current)})
            return
        open_evictable = [i for i in self.open_incidents() if vocab.may_evict(i.kind)]
        verdict = self.guards.check(node, decision, incident, self.fleet_size(), open_evictable)
        self.metrics.breaker_open.labels("eviction").set(1 if self.guards.breaker.is_open else 0)
        self.decisions.append({**record, "outcome": verdict.code, "reason": verdict.reason})
        if not verdict.allowed:
            if verdict.code == "dry_run":
                log.warning("remediation_dry_run", incident=incident.id, node=node, would=decision.action)
                self.evictions.append(Eviction(node, incident.id, self._clock_ms(), None, dry_run=True))
            elif verdict.code == "approval_required":
                self.guards.request_approval(incident, node, decision)
                log.warning("remediation_awaits_approval", incident=incident.id, node=node, action=decision.action)
            else:
                log.warning(
                    "remediation_refused", incident=incident.id, node=node, code=verdict.code, reason=verdict.reason
                )
            return
        log.warning(
            "remediation_start",
            incident=incident.id,
            node=node,
            action=decision.action,
            checkpoint_first=decision.checkpoint_first,
            reason=decision.reason,
        )
        self._transition(node, S.SUSPECT, decision.reason, incident.id)
        if decision.action == "cordon":
            await self._act(node, "cordon", incident.id, lambda: self.scheduler.cordon(node, self._reason(incident)))
            self._transition(node, S.CORDONED, "cordoned by policy", incident.id)
            return
        jobs = self.jobs.jobs_of(node)
        if decision.checkpoint_first and jobs:
            await self._checkpoint(jobs, incident)
        self._transition(node, S.CORDONED, "cordoned before draining", incident.id)
        self._transition(node, S.DRAINING, decision.reason, incident.id)
        await self._evict(node, decision, incident, jobs)

    async def _evict(
        self, node: str, decision: Decision, incident: Incident, jobs: list[str], resumed: bool = False
    ) -> None:
        """Drain, pick a spare, requeue the node's jobs onto it, then the follow-up (reset, reboot, RMA).

        Every scheduler step is planned and marked (``_act``), so running this again for
        the same incident (``resumed``: a new controller finishing what a dead one began)
        performs only the steps not yet done.
        """
        await self._act(node, "drain", incident.id, lambda: self.scheduler.drain(node, self._reason(incident)))
        self._leave_pool(node)
        # A spare only for a node that ran a job: an idle node's eviction must not empty the
        # pool that the next working node's eviction needs.
        spare = ((self._spare_of(node) if resumed else None) or self._pick_spare(node, jobs)) if jobs else None
        prefer: list[str] = [spare] if spare else []
        now = self._clock_ms()
        placed: list[str] = []
        for job in jobs:
            if resumed and self._done(node, "requeue", incident.id, job):
                continue
            self.jobs.mark_interrupted(job, now, f"{incident.kind} on {node}")
            result = await self._act(node, "requeue", incident.id, self._requeue_call(job, node, prefer), job=job)
            placed.append(result.detail)
            record_job = self.jobs.job(job)
            resumed_from = record_job.last_complete_step if record_job is not None else 0
            self.jobs.mark_resumed(job, self._clock_ms(), resumed_from)
        self._transition(node, S.EVICTED, f"evicted: {decision.reason}", incident.id)
        self.metrics.evictions.labels(incident.kind, "incident").inc()
        eviction = Eviction(node, incident.id, now, spare, jobs, placement="; ".join(p for p in placed if p))
        if jobs and spare is None:
            log.warning("eviction_without_spare", node=node, incident=incident.id, jobs=jobs,
                        placement=eviction.placement)  # fmt: skip
        self.evictions.append(eviction)
        if decision.action == "rma":
            self._transition(node, S.RETIRED, "marked for hardware inspection (RMA)", incident.id)
        elif self.repairs is not None:  # the repair loop takes it from here: reset/reboot, validate, return
            requested = decision.action if decision.action in ("reboot", "reset_gpu") else None
            self.repairs.begin(node, incident, requested)
            self.repairs.poke()
        elif decision.action in ("reboot", "reset_gpu"):
            self._agent_command(node, decision.action, incident)
            self._transition(node, S.REPAIRING, f"{decision.action} requested", incident.id)
        log.warning("remediation_done", incident=incident.id, node=node, replacement=spare, jobs=jobs)

    # -- steps -------------------------------------------------------------------------------
    @staticmethod
    def _reason(incident: Incident) -> str:
        return f"{incident.kind} {incident.root_cause} ({incident.id})"

    def _transition(self, node: str, to: NodeHealState, reason: str, incident_id: str) -> None:
        try:
            self.store.transition(node, to, reason, incident_id, AUTOMATIC)
        except InvalidTransition as exc:
            log.info("heal_transition_skipped", node=node, to=str(to), detail=str(exc))

    async def _act(
        self,
        node: str,
        kind: str,
        incident_id: str,
        call: Callable[[], Any],
        job: str | None = None,
    ) -> ActionResult:
        """Plan, perform (retrying temporary failures), mark: exactly-once across restarts."""
        action = self.store.plan_action(node, kind, incident_id, job)
        if action.status == "done":  # performed (and marked) by an earlier run: never twice
            log.info("scheduler_action_already_done", node=node, action=kind, job=job, action_id=action.action_id)
            return ActionResult.success("already done")
        result = ActionResult.temporary("not attempted")
        for attempt in range(1, self.config.action_retries + 1):
            result = await call()
            if result.ok or result.permanent:
                break
            log.warning("scheduler_action_retry", node=node, action=kind, attempt=attempt, detail=result.detail)
            await self.clock.sleep(self.config.retry_delay_s)
        self.store.mark_action(
            action.action_id, "done" if result.ok else "failed", None if result.ok else result.detail
        )
        log.info("scheduler_action", node=node, action=kind, job=job, ok=result.ok, detail=result.detail)
        return result

    async def _checkpoint(self, jobs: list[str], incident: Incident) -> None:
        """Ask every node of the node's jobs to checkpoint; wait (bounded) for it to complete."""
        before = {j: self._checkpoint_step(j) for j in jobs}
        for job in jobs:
            for node in self.jobs.nodes_of(job):
                self._command(node, spb.COMMAND_KIND_CHECKPOINT_REQUEST, {"job": job}, incident)
            await self.scheduler.signal_job(job, "USR1")
        deadline = self.clock.monotonic() + self.config.checkpoint_timeout_s
        while self.clock.monotonic() < deadline:
            current = {j: self._checkpoint_step(j) for j in jobs}
            if all(current[j] > before[j] for j in jobs):
                log.info("checkpoint_before_eviction", jobs=jobs, steps=current)
                return
            await self.clock.sleep(0.2)
        log.warning("checkpoint_before_eviction_timed_out", jobs=jobs, timeout_s=self.config.checkpoint_timeout_s)

    def _requeue_call(self, job: str, node: str, prefer: list[str]) -> Callable[[], Any]:
        return lambda: self.scheduler.requeue(job, [node], list(prefer))

    def _checkpoint_step(self, job: str) -> int:
        record = self.jobs.job(job)
        return record.last_complete_step if record is not None else 0

    def _pick_spare(self, node: str, jobs: list[str]) -> str | None:
        if self.spares is None:
            return None
        spare = self.spares.choose(node)
        if spare is None:
            log.warning("no_healthy_spare", node=node)
            return None
        try:
            self.spares.allocate(spare, node, jobs[0] if jobs else None)
        except SpareError as exc:
            log.warning("spare_allocation_failed", spare=spare, detail=str(exc))
            return None
        if self.store.state(spare) == S.SPARE:  # a repaired node from the pool goes back to work
            self.store.transition(spare, S.IN_SERVICE, f"took over for {node}", self.store.record(spare).incident_id)
        return spare

    def _command(self, node: str, kind: int, args: dict[str, str], incident: Incident) -> None:
        command = spb.Command(id=f"{incident.id}:{node}:{kind}", kind=kind, args=args)  # type: ignore[arg-type]
        try:
            self.registry.send_command(node, command)
        except LookupError:
            log.warning("agent_command_no_node", node=node, kind=kind)

    def _agent_command(self, node: str, action: str, incident: Incident) -> None:
        kind = spb.COMMAND_KIND_REBOOT if action == "reboot" else spb.COMMAND_KIND_GPU_RESET
        args = {"reason": self._reason(incident)}
        gpu = incident.root_cause.rsplit("/gpu-", 1)
        if len(gpu) == 2 and gpu[1].isdigit():
            args["gpu"] = gpu[1]
        self._command(node, kind, args, incident)

    def _leave_pool(self, node: str) -> None:
        """A node that stood in for another and is evicted itself stops standing in: its
        allocation ends, so once repaired it can refill the pool like any other node."""
        if self.spares is None:
            return
        if self.spares.allocated_to(node) is not None:
            self.spares.release(node)

    def _spare_of(self, node: str) -> str | None:
        if self.spares is None:
            return None
        return next((s.spare for s in self.spares.list() if s.allocated_to == node), None)

    def _done(self, node: str, kind: str, incident_id: str, job: str | None) -> bool:
        return any(
            a.kind == kind and a.incident_id == incident_id and a.job == job and a.status == "done"
            for a in self.store.actions(node)
        )

    async def _resume_interrupted(self) -> None:
        """A controller that died between a remediation's steps: finish the eviction it began.

        A node we were draining (state ``draining``, taken out by us, for an incident still
        open) gets the remaining steps of ``_evict``; those already done are skipped.
        """
        open_by_id = {i.id: i for i in self.open_incidents()}
        for record in self.store.all_records():
            if record.state != S.DRAINING or record.drained_by != AUTOMATIC or record.incident_id is None:
                continue
            incident = open_by_id.get(record.incident_id)
            if incident is None:
                log.warning("remediation_resume_incident_gone", node=record.node, incident=record.incident_id)
                continue
            decision = self.policy.decide(incident, self.history)
            if not decision.evicts or decision.node != record.node:
                log.warning("remediation_resume_decision_changed", node=record.node, incident=incident.id)
                continue
            log.warning("remediation_resume", node=record.node, incident=incident.id, action=decision.action)
            try:
                await self._evict(record.node, decision, incident, self.jobs.jobs_of(record.node), resumed=True)
            except Exception:
                log.exception("remediation_resume_failed", node=record.node, incident=incident.id)

    async def _replay_planned(self) -> None:
        """A controller that died mid-remediation: finish the planned scheduler actions."""
        for action in self.store.planned():
            log.warning("remediation_resume_planned", action=action.action_id, node=action.node, kind=action.kind)
            reason = f"resumed remediation ({action.incident_id})"
            if action.kind == "drain":
                result = await self.scheduler.drain(action.node, reason)
            elif action.kind == "cordon":
                result = await self.scheduler.cordon(action.node, reason)
            elif action.kind == "restart_in_place" and action.job:
                result = await self.scheduler.requeue(action.job, [], [])
            elif action.kind == "requeue" and action.job:
                spare = self._spare_of(action.node)
                result = await self.scheduler.requeue(action.job, [action.node], [spare] if spare else [])
            else:
                result = ActionResult.failure(f"no replay for {action.kind}")
            self.store.mark_action(action.action_id, "done" if result.ok else "failed", result.detail or None)
