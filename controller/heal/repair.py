"""After the eviction: repair the node, prove it healthy, put it back, or retire it.

Why a loop of its own: the eviction ends in seconds, a repair takes minutes (a reboot of a
GPU server is 5-15) and must survive a controller failover half-way. Every node evicted by
starpulse (never one someone else drained) climbs its incident kind's ladder
(``controller/heal/ladder.py``)::

    evicted -> repairing (reset_gpu | reboot) -> validating -> spare | in_service
                   ^------------ failed: next rung -----'  \\-> retired (the ladder's end, RMA)

- **reset_gpu** goes to the node's agent as a ``GPU_RESET`` command (only after the
  eviction, so the GPUs are idle; on an NVSwitch system without a GPU index, so the agent's
  template resets all GPUs and switches together, as NVIDIA requires), and is done when the
  agent answers ok within the rung's time limit.
- **reboot** goes through the scheduler where it can (``SchedulerReboot``: Slurm's
  ``scontrol reboot ASAP nextstate=DOWN``, so the node comes back down and unvalidated),
  else to the agent; it is done when the node's agent says hello with a new boot id.
- **validation** then needs the node's own verdict clean (its incident's conditions all
  resolved, no other incident open on it), the evidence quiet for a while (the Xid not
  repeating), and each configured diagnostic run by the agent within its limit and judged
  (``diagnostics.judge``); every result is kept as evidence.

Pass: the incident resolves on that evidence, the node is resumed in the scheduler (only
while the scheduler's reason is still starpulse's: ``resume`` checks) and joins the spare
pool (``return_to: spare``) or goes back to work. Fail or time out: the next rung.

Each repair action is planned in ``heal_pending_actions`` before it is performed and marked
after (as the drain), and the rung, its deadline and the boot id before a reboot are kept
in ``heal_repairs``: a new leader continues a node where the old one left it (waiting out a
reboot already asked for, never asking twice).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import structlog

from controller.detect.model import Incident
from controller.heal.diagnostics import Verdict, judge
from controller.heal.ladder import NONE, REBOOT, RESET_GPU, RETIRE, RepairPolicy
from controller.heal.policy import target_node
from controller.heal.scheduler.base import ActionResult, Scheduler
from controller.heal.spares import SpareError, SparePool
from controller.heal.states import AUTOMATIC, InvalidTransition, NodeHealState, RemediationStore
from controller.store import transaction
from starpulse.core.clock import Clock
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)
S = NodeHealState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_repairs (
    node TEXT PRIMARY KEY,
    incident_id TEXT,
    kind TEXT NOT NULL,
    rung INTEGER NOT NULL,
    started_ms INTEGER NOT NULL,
    deadline_ms INTEGER,
    boot_before TEXT NOT NULL DEFAULT '',
    evidence TEXT NOT NULL DEFAULT '[]'
);
"""


@runtime_checkable
class SchedulerReboot(Protocol):
    """A scheduler that can reboot a node itself (Slurm); others reboot through the agent."""

    async def reboot(self, node: str, reason: str) -> ActionResult: ...


class NodeAgents(Protocol):
    """What the loop needs of the node registry: commands with answers, and boot ids."""

    async def run_command(self, node_id: str, command: spb.Command, timeout_s: float) -> spb.CommandResult | None: ...

    def boot_id(self, node_id: str) -> str: ...

    def has_nvswitch(self, node_id: str) -> bool: ...


@dataclass
class Repair:
    """One node's way through its ladder (a row of ``heal_repairs``)."""

    node: str
    incident_id: str | None
    kind: str
    rung: int
    started_ms: int
    # While repairing: a reboot's deadline (set: the reboot was asked for; a new leader only
    # waits). While validating: when validation began (evidence older than that predates the repair).
    deadline_ms: int | None = None
    boot_before: str = ""
    evidence: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RepairConfig:
    poll_s: float = 2.0  # how often a reboot's new boot id is looked for (HealConfig.repair_poll_s)


class RepairLoop:
    """Drives every node starpulse evicted through repair and validation (module docstring)."""

    def __init__(
        self,
        policy: RepairPolicy,
        store: RemediationStore,
        scheduler: Scheduler,
        agents: NodeAgents,
        open_incidents: Callable[[], list[Incident]],
        conditions_clear: Callable[[str, int | None], bool],
        resolve: Callable[[str, str, int | None], object],
        spares: SparePool | None,
        clock: Clock,
        config: RepairConfig | None = None,
        holds_node: Callable[[Incident, str], bool] | None = None,
        not_judged: Callable[[str], str] | None = None,
    ) -> None:
        self.policy = policy
        # Why a node's accelerators were not read ("" when they were): such a node never passes
        # validation, whatever its incidents say (issue 30: never healthy for what was not read).
        self.not_judged = not_judged or (lambda node: "")
        # Which other open incidents bar a node's return (the heal policy's ``holds``); by
        # default those that blame the node, never a switch fault it only sits under.
        self.holds_node = holds_node or (lambda incident, node: target_node(incident) == node)
        self.store = store
        self.scheduler = scheduler
        self.agents = agents
        self.open_incidents = open_incidents
        self.conditions_clear = conditions_clear
        self.resolve = resolve
        self.spares = spares
        self.clock = clock
        self.config = config or RepairConfig()
        self._db: sqlite3.Connection = store.conn
        self._db.executescript(_SCHEMA)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self.outcomes: list[dict[str, Any]] = []  # what happened, in order (the demo's summary reads it)

    # -- the rows ------------------------------------------------------------------------------

    def repair(self, node: str) -> Repair | None:
        r = self._db.execute(
            "SELECT node, incident_id, kind, rung, started_ms, deadline_ms, boot_before, evidence "
            "FROM heal_repairs WHERE node = ?",
            (node,),
        ).fetchone()
        return _row(r) if r else None

    def _save(self, rep: Repair) -> None:
        with transaction(self._db):
            self._db.execute(
                "INSERT INTO heal_repairs(node, incident_id, kind, rung, started_ms, deadline_ms, boot_before, "
                "evidence) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET incident_id = "
                "excluded.incident_id, kind = excluded.kind, rung = excluded.rung, started_ms = excluded.started_ms, "
                "deadline_ms = excluded.deadline_ms, boot_before = excluded.boot_before, evidence = excluded.evidence",
                (rep.node, rep.incident_id, rep.kind, rep.rung, rep.started_ms, rep.deadline_ms, rep.boot_before,
                 json.dumps(rep.evidence)),
            )  # fmt: skip

    def _evidence(self, rep: Repair, step: str, ok: bool, detail: str) -> None:
        rep.evidence.append({"at_ms": self.clock.time_ms(), "step": step, "ok": ok, "detail": detail[:2000]})
        self._save(rep)
        log.info("repair_evidence", node=rep.node, step=step, ok=ok, detail=detail[:300])

    # -- entry points ----------------------------------------------------------------------------

    def begin(self, node: str, incident: Incident, requested: str | None) -> Repair:
        """The healer evicted ``node`` for ``incident``: choose its first rung (the policy's
        requested repair, raised by its lemon score) and start. Idempotent for one incident."""
        rep = self.repair(node)
        if rep is not None and rep.incident_id == incident.id:
            return rep
        score = self.lemon_score(node)
        rep = Repair(node, incident.id, incident.kind, self.policy.first_rung(incident.kind, requested, score),
                     self.clock.time_ms())  # fmt: skip
        if score:
            rep.evidence.append({"at_ms": rep.started_ms, "step": "lemon", "ok": False,
                                 "detail": f"{score} return(s) within the lemon window: starting higher"})  # fmt: skip
        self._save(rep)
        log.warning("repair_begin", node=node, incident=incident.id, rung=self._rung(rep), lemon=score)
        return rep

    def _enter(self, rep: Repair, rung: str) -> bool:
        """Onto the rung: repairing (validating for ``none``); True when it is the ladder's end (retired)."""
        if rung == RETIRE:
            self._retire(rep, "the ladder's end")
            return True
        target = S.VALIDATING if rung == NONE else S.REPAIRING
        self._move(rep.node, target, f"{rung}: rung {rep.rung + 1} of {rep.kind}", rep)
        return False

    def enter_rung(self, node: str) -> str | None:
        """An evicted node onto its first rung, as the drive loop's first step, without driving it
        (the fleet simulator: the rung's time comes from data). The rung; None: not evicted here."""
        rep = self.repair(node)
        if rep is None or self.store.state(node) != S.EVICTED:
            return None
        rung = self._rung(rep)
        self._enter(rep, rung)
        return rung

    def current_rung(self, node: str) -> str | None:
        """The rung ``node`` is on (None: no repair of it)."""
        rep = self.repair(node)
        return None if rep is None else self._rung(rep)

    def rung_result(self, node: str, ok: bool, detail: str) -> bool:
        """The agent's answer to the node's current rung, as the drive loop takes it (the fleet
        simulator plays the agents' round trips): done moves it on to validating, otherwise it
        climbs (the next rung, or retired at the ladder's end). False: not repairing here."""
        rep = self.repair(node)
        if rep is None or self.store.state(node) != S.REPAIRING:
            return False
        rung = self._rung(rep)
        action = self.store.plan_action(node, rung, rep.incident_id)
        self.store.mark_action(action.action_id, "done" if ok else "failed", None if ok else detail)
        self._evidence(rep, rung, ok, detail)
        if ok:
            self._move(node, S.VALIDATING, f"{rung} done; validating", rep)
        else:
            self._climb(rep, f"{rung} did not finish")
        return True

    def validation_failed(self, node: str, step: str, why: str) -> bool:
        """The node's validation failed at ``step`` (scan, evidence_quiet, diagnostic:NAME): the
        evidence kept and the next rung taken, as the drive loop does. False: not validating here."""
        rep = self.repair(node)
        if rep is None or self.store.state(node) != S.VALIDATING:
            return False
        self._evidence(rep, step, False, why)
        self._climb(rep, f"validation failed: {why}")
        return True

    async def finish(self, node: str, detail: str) -> bool:
        """Return ``node`` as a repair that validated does (resume, spare or in service, incident
        resolved), its rungs and waits having passed elsewhere: the fleet simulator draws repair
        times from data instead of driving agents. False: no repair of this node is under way."""
        rep = self.repair(node)
        if rep is None or self.store.state(node) not in (S.EVICTED, S.REPAIRING, S.VALIDATING):
            return False
        if self.store.state(node) != S.VALIDATING and not self._move(node, S.VALIDATING, detail, rep):
            return False
        await self._return(rep, Verdict(True, detail))
        return True

    def lemon_score(self, node: str) -> int:
        """Returns to service (validating -> spare/in_service) within the lemon window."""
        since = self.clock.time_ms() - int(self.policy.lemon.window_s * 1000)
        return sum(
            1
            for t in self.store.history(node, since_ms=since)
            if t.from_state == S.VALIDATING and t.to_state in (S.SPARE, S.IN_SERVICE)
        )

    def nodes_to_drive(self) -> list[str]:
        """Nodes starpulse took out that are evicted, repairing or validating."""
        return [
            r.node
            for r in self.store.all_records()
            if r.state in (S.EVICTED, S.REPAIRING, S.VALIDATING) and r.drained_by == AUTOMATIC
        ]

    def poke(self) -> None:
        """Start a task for every node that needs one (after a failover too); called every sweep."""
        for node in self.nodes_to_drive():
            task = self._tasks.get(node)
            if task is None or task.done():
                self._tasks[node] = asyncio.create_task(self._drive_safely(node), name=f"repair-{node}")

    async def settle(self) -> None:
        """Wait for every running node task (tests and the demo's end)."""
        while running := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(running)

    def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()

    # -- one node --------------------------------------------------------------------------------

    def _rung(self, rep: Repair) -> str:
        ladder = self.policy.ladder(rep.kind)
        return ladder[min(rep.rung, len(ladder) - 1)]

    def _move(self, node: str, to: NodeHealState, reason: str, rep: Repair) -> bool:
        try:
            self.store.transition(node, to, reason, rep.incident_id, AUTOMATIC)
            return True
        except InvalidTransition as exc:
            log.warning("repair_transition_refused", node=node, to=str(to), detail=str(exc))
            return False

    async def _drive_safely(self, node: str) -> None:
        try:
            await self._drive(node)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("repair_failed", node=node)

    async def _drive(self, node: str) -> None:
        while True:
            rec = self.store.record(node)
            if rec.drained_by != AUTOMATIC or rec.state not in (S.EVICTED, S.REPAIRING, S.VALIDATING):
                return  # someone else holds it now, or it is done
            rep = self.repair(node)
            if rep is None or rep.incident_id != rec.incident_id:
                rep = Repair(node, rec.incident_id, self._kind_of(rec.incident_id), 0, self.clock.time_ms())
                self._save(rep)
            rung = self._rung(rep)
            if rec.state == S.EVICTED or (rec.state == S.REPAIRING and rung == NONE):
                if self._enter(rep, rung):
                    return
                continue
            if rec.state == S.REPAIRING:
                if await self._repair_step(rep, rung):
                    self._move(node, S.VALIDATING, f"{rung} done; validating", rep)
                else:
                    self._climb(rep, f"{rung} did not finish")
                continue
            verdict = await self._validate(rep)
            if verdict.passed:
                await self._return(rep, verdict)
                return
            self._climb(rep, f"validation failed: {verdict.detail}")

    def _kind_of(self, incident_id: str | None) -> str:
        inc = next((i for i in self.open_incidents() if i.id == incident_id), None)
        return inc.kind if inc is not None else "default"

    def _climb(self, rep: Repair, why: str) -> None:
        rep.rung += 1
        rep.deadline_ms, rep.boot_before = None, ""
        self._save(rep)
        rung = self._rung(rep)
        log.warning("repair_climb", node=rep.node, to=rung, why=why)
        if rung == RETIRE:
            self._retire(rep, why)
            return
        state = self.store.state(rep.node)
        if state == S.VALIDATING:
            self._move(rep.node, S.REPAIRING, f"{rung} after: {why}", rep)

    def _retire(self, rep: Repair, why: str) -> None:
        self._move(rep.node, S.RETIRED, f"retired for hardware inspection (RMA): {why}", rep)
        self._evidence(rep, "retire", False, f"RMA: {why}")
        self.outcomes.append({"node": rep.node, "outcome": "retired", "why": why, "at_ms": self.clock.time_ms()})
        log.error("repair_retired_rma", node=rep.node, incident=rep.incident_id, why=why)

    # -- repair actions -------------------------------------------------------------------------

    async def _repair_step(self, rep: Repair, rung: str) -> bool:
        action = self.store.plan_action(rep.node, rung, rep.incident_id)
        if action.status == "done":
            return True
        if rung == RESET_GPU:
            ok, detail = await self._reset_gpu(rep)
        elif rung == REBOOT:
            ok, detail = await self._reboot(rep)
        else:
            ok, detail = False, f"no repair action {rung!r}"
        self.store.mark_action(action.action_id, "done" if ok else "failed", None if ok else detail)
        self._evidence(rep, rung, ok, detail)
        return ok

    async def _reset_gpu(self, rep: Repair) -> tuple[bool, str]:
        args = {"reason": f"starpulse: repair for {rep.incident_id}", "timeout_s": str(self._limit(RESET_GPU))}
        gpu = self._gpu_of(rep.incident_id)
        if gpu is not None and not self.agents.has_nvswitch(rep.node):
            args["gpu"] = gpu  # on NVSwitch systems no index: all GPUs and switches reset together
        command = spb.Command(id=f"{rep.incident_id}:{rep.node}:reset:{rep.rung}", kind=spb.COMMAND_KIND_GPU_RESET,
                              args=args)  # fmt: skip
        result = await self.agents.run_command(rep.node, command, self._limit(RESET_GPU))
        if result is None:
            return False, f"no answer within {self._limit(RESET_GPU):g}s"
        return result.ok, result.message

    async def _reboot(self, rep: Repair) -> tuple[bool, str]:
        now = self.clock.time_ms()
        if rep.deadline_ms is None:  # not asked yet (a new leader that finds a deadline only waits)
            rep.boot_before = self.agents.boot_id(rep.node)
            rep.deadline_ms = now + int(self._limit(REBOOT) * 1000)
            self._save(rep)
            reason = f"starpulse: reboot for {rep.incident_id}"
            if isinstance(self.scheduler, SchedulerReboot) and getattr(self.scheduler, "can_reboot", True):
                asked = await self.scheduler.reboot(rep.node, reason)
                if not asked.ok:
                    return False, f"scheduler refused the reboot: {asked.detail}"
            else:
                command = spb.Command(id=f"{rep.incident_id}:{rep.node}:reboot:{rep.rung}",
                                      kind=spb.COMMAND_KIND_REBOOT, args={"reason": reason})  # fmt: skip
                # Fire and forget: a rebooting node may never answer; its new boot id is the answer.
                task = asyncio.ensure_future(self.agents.run_command(rep.node, command, self._limit(REBOOT)))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        while self.clock.time_ms() < rep.deadline_ms:
            current = self.agents.boot_id(rep.node)
            if current and current != rep.boot_before:
                return True, f"boot id {rep.boot_before or '?'} -> {current}"
            await self.clock.sleep(self.config.poll_s)
        return False, f"no new boot id within {self._limit(REBOOT):g}s"

    def _limit(self, rung: str) -> float:
        return self.policy.timeout_s(rung)

    def _gpu_of(self, incident_id: str | None) -> str | None:
        inc = next((i for i in self.open_incidents() if i.id == incident_id), None)
        if inc is None:
            return None
        _, sep, tail = inc.root_cause.rpartition("/gpu-")
        return tail if sep and tail.isdigit() else None

    # -- validation -------------------------------------------------------------------------------

    async def _validate(self, rep: Repair) -> Verdict:
        v = self.policy.validation(rep.kind)
        node = rep.node
        rep.deadline_ms = self.clock.time_ms()  # validation's start: evidence older than this was before the repair
        self._save(rep)
        if v.scan_clean:
            # A repair ends the fault at once; its conditions resolve a report or two later.
            give_up = self.clock.time_ms() + int(v.clear_within_s * 1000)
            clean, why = self._scan_clean(rep)
            while not clean and self.clock.time_ms() < give_up:
                await self.clock.sleep(self.config.poll_s)
                clean, why = self._scan_clean(rep)
            self._evidence(rep, "scan", clean, why if clean else f"{why} after {v.clear_within_s:g}s")
            if not clean:
                return Verdict(False, why)
        if v.evidence_quiet_s > 0:
            quiet_until = self.clock.time_ms() + int(v.evidence_quiet_s * 1000)
            while self.clock.time_ms() < quiet_until:
                await self.clock.sleep(min(self.config.poll_s, v.evidence_quiet_s))
                clean, why = self._scan_clean(rep)
                if not clean:
                    self._evidence(rep, "evidence_quiet", False, why)
                    return Verdict(False, f"the fault came back: {why}")
            self._evidence(rep, "evidence_quiet", True, f"nothing new for {v.evidence_quiet_s:g}s")
        passed: list[str] = []
        for diag in v.diagnostics:
            command = spb.Command(
                id=f"{rep.incident_id}:{node}:diag:{diag.name}:{rep.rung}",
                kind=spb.COMMAND_KIND_RUN_DIAGNOSTIC,
                args={"diagnostic": diag.name, "timeout_s": f"{diag.timeout_s:g}", **({"args": diag.args} if diag.args
                                                                                        else {})},
            )  # fmt: skip
            # The agent kills it at the limit; the controller waits a little longer for that answer.
            result = await self.agents.run_command(node, command, diag.timeout_s + 10)
            if result is None:
                verdict = Verdict(False, f"{diag.name}: no answer within {diag.timeout_s:g}s (hung or node gone)")
            else:
                verdict = judge(diag.passes, result.ok, result.message)
                verdict = Verdict(verdict.passed, f"{diag.name}: {verdict.detail}")
            self._evidence(rep, f"diagnostic:{diag.name}", verdict.passed, verdict.detail)
            if not verdict.passed:
                return verdict
            passed.append(verdict.detail)
        unread = self.not_judged(node)
        if unread:  # whatever the policy checks, a node whose chips were not read never passes
            self._evidence(rep, "judged", False, unread)
            return Verdict(False, f"not judged: {unread}")
        return Verdict(True, "; ".join(passed) or "scan clean, evidence quiet")

    def _scan_clean(self, rep: Repair) -> tuple[bool, str]:
        since = rep.deadline_ms
        why = self.not_judged(rep.node)
        if why:
            return False, f"not judged: {why}"
        if rep.incident_id and self._is_open(rep.incident_id) and not self.conditions_clear(rep.incident_id, since):
            return False, f"{rep.incident_id}: a condition is still active (seen again since the repair)"
        others = [i.id for i in self.open_incidents() if i.id != rep.incident_id and self.holds_node(i, rep.node)]
        if others:
            return False, f"open incident(s) on the node: {', '.join(sorted(others))}"
        return True, "no active condition, no other open incident"

    async def _jobs_on(self, node: str) -> list[str]:
        """The jobs the scheduler runs on ``node`` now ([] when it cannot say)."""
        try:
            return list((await self.scheduler.node_status(node)).jobs)
        except Exception as exc:  # a scheduler that cannot answer: the node counts as idle
            log.info("repair_node_status_unknown", node=node, detail=str(exc))
            return []

    def _is_open(self, incident_id: str) -> bool:
        return any(i.id == incident_id for i in self.open_incidents())

    def spare_target(self) -> int:
        """Available spares the pool is refilled to: the policy's target for this fleet's size."""
        if self.spares is None:
            return 0
        return self.policy.spare_target_for(self.spares.fleet_nodes())

    async def _return(self, rep: Repair, verdict: Verdict) -> None:
        """Resume the node in the scheduler (only a drain of ours), park it, resolve its incident."""
        node = rep.node
        action = self.store.plan_action(node, "resume", rep.incident_id)
        result = (
            ActionResult.success("already done")
            if action.status == "done"
            else await self.scheduler.resume(node, f"starpulse: repaired and validated ({rep.incident_id})")
        )
        self.store.mark_action(
            action.action_id, "done" if result.ok else "failed", None if result.ok else result.detail
        )
        if not result.ok:
            # The scheduler's reason is someone else's now (or it refused): leave the node to them.
            self._evidence(rep, "resume", False, result.detail)
            log.warning("repair_resume_refused", node=node, detail=result.detail)
            return
        # A job that waited for capacity (the pool was empty) may have started on the node the
        # moment it was resumed: then it is at work, not a spare.
        busy = await self._jobs_on(node)
        to_spare = (
            not busy
            and self.policy.return_to == "spare"
            and self.spares is not None
            and self.spares.counts()["available"] < self.spare_target()
        )
        target = S.SPARE if to_spare else S.IN_SERVICE
        where = "in the spare pool" if to_spare else f"at work ({', '.join(busy)})" if busy else "in service"
        if not self._move(node, target, f"validated; back {where}", rep):
            return
        if to_spare and self.spares is not None:
            try:
                self.spares.mark_spare(node)
            except SpareError as exc:
                log.warning("repair_spare_mark_failed", node=node, detail=str(exc))
        self._evidence(rep, "return", True, f"resumed in {self.scheduler.name}; {target}")
        if rep.incident_id:  # on the evidence, not after a long hold (its webhook says why)
            self.resolve(rep.incident_id, f"{node} repaired and validated: {verdict.detail}", rep.deadline_ms)
        took_ms = self.clock.time_ms() - rep.started_ms
        self.outcomes.append({"node": node, "outcome": str(target), "took_ms": took_ms, "at_ms": self.clock.time_ms()})
        log.warning("repair_returned", node=node, to=str(target), took_s=round(took_ms / 1000, 1))


def _row(r: tuple[Any, ...]) -> Repair:
    return Repair(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]))
