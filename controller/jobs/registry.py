"""The job registry: which job runs where, how far it got, its last complete checkpoint,
and what each interruption cost (restarts, steps lost, downtime).

Fed by agents' reports (``JobStepSample`` per rank, an IngestListener) and by
declarations from the scheduler or a scenario (``register_job``). Remediation asks it
"which jobs run on this node" before evicting, "is there a complete checkpoint", and
records interruption and resume so it can confirm that a job came back from the
checkpoint step.

A checkpoint is complete for the job when every rank completed it, so the job's last
complete checkpoint is the minimum over its ranks of ``last_checkpoint_step`` (once
all ``world_size`` ranks have reported). It only moves forward.

Persistence: its own tables on the controller's SQLite connection. Rank progress is
kept in memory and written through when something durable changes (node, pid, world
size, checkpoint) or at most every ``persist_interval_ms`` for step progress, so a
thousand nodes reporting every few seconds do not turn into a write per rank per report.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import structlog

from controller.ingest.registry import NodeRecord
from controller.store import transaction
from starpulse.core.clock import Clock
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)
_NONE_LISTED: frozenset[tuple[str, int]] = frozenset()  # compares equal to an empty set


class WithJobSteps(Protocol):
    """What the registry reads of a report: a Report, or the verdict ingest records for one."""

    @property
    def job_steps(self) -> Sequence[tpb.JobStepSample]:
        """The ranks' job steps the report carried."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_jobs (
    job TEXT PRIMARY KEY,
    checkpoint_dir TEXT NOT NULL DEFAULT '',
    declared_nodes TEXT NOT NULL DEFAULT '[]',
    world_size INTEGER NOT NULL DEFAULT 0,
    last_complete_step INTEGER NOT NULL DEFAULT 0,
    last_complete_path TEXT NOT NULL DEFAULT '',
    last_complete_ms INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'running',
    first_seen_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS heal_job_ranks (
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    step INTEGER NOT NULL,
    step_time_s REAL NOT NULL,
    last_checkpoint_step INTEGER NOT NULL,
    checkpoint_path TEXT NOT NULL,
    last_checkpoint_ms INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    world_size INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (job, rank)
);
CREATE INDEX IF NOT EXISTS heal_job_ranks_node ON heal_job_ranks(node);
CREATE TABLE IF NOT EXISTS heal_job_restarts (
    job TEXT NOT NULL,
    interrupted_ms INTEGER NOT NULL,
    reason TEXT NOT NULL,
    interrupted_step INTEGER NOT NULL,
    resumed_ms INTEGER,
    resumed_from_step INTEGER,
    first_step_ms INTEGER,
    first_step INTEGER,
    PRIMARY KEY (job, interrupted_ms)
);
"""

RUNNING = "running"
INTERRUPTED = "interrupted"  # stopped; not yet restarted
RESUMING = "resuming"  # restarted; waiting for its first step


@dataclass
class RankRecord:
    job: str
    rank: int
    node: str
    step: int = 0
    step_time_s: float = 0.0
    last_checkpoint_step: int = 0
    checkpoint_path: str = ""
    last_checkpoint_ms: int = 0
    pid: int = 0
    world_size: int = 0
    updated_ms: int = 0
    resumed_from_step: int = 0  # what this run of the rank says it resumed from (in memory only)
    phase: str = ""  # what the rank says it does (starpulse.job phases; in memory only)
    phase_since_ms: int = 0  # agent wall clock when it entered the phase
    moved_ms: int = 0  # controller clock when its step last changed (in memory only)


@dataclass
class RestartRecord:
    interrupted_ms: int
    reason: str
    interrupted_step: int
    resumed_ms: int | None = None
    resumed_from_step: int | None = None
    first_step_ms: int | None = None
    first_step: int | None = None

    @property
    def steps_lost(self) -> int:
        if self.resumed_from_step is None:
            return 0
        return max(self.interrupted_step - self.resumed_from_step, 0)

    @property
    def resumed_from_checkpoint(self) -> bool | None:
        """True when the first step after resume followed the checkpoint step; None until seen."""
        if self.first_step is None or self.resumed_from_step is None:
            return None
        return self.first_step == self.resumed_from_step + 1


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's own word on its progress (launcher or scheduler), not a rank's sample."""

    step: int
    at_ms: int  # when the job says it reached the step (its clock)
    phase: str = ""  # e.g. "train", "checkpoint", "eval": a hang detector reads a stall per phase
    received_ms: int = 0  # when the controller heard it (its clock)


@dataclass
class JobRecord:
    job: str
    checkpoint_dir: str = ""
    declared_nodes: list[str] = field(default_factory=list)
    world_size: int = 0
    last_complete_step: int = 0
    last_complete_path: str = ""
    last_complete_ms: int = 0
    state: str = RUNNING
    first_seen_ms: int = 0
    updated_ms: int = 0
    ranks: dict[int, RankRecord] = field(default_factory=dict)
    history: list[RestartRecord] = field(default_factory=list)
    now_ms: int = 0  # when this snapshot was taken (open downtime counts up to it)
    progress: JobProgress | None = None  # the job-level entry's latest (DecisionCore.job_progress)

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.declared_nodes) | {r.node for r in self.ranks.values()})

    @property
    def step(self) -> int:
        """The furthest step any rank has reported (ranks advance in lockstep)."""
        return max((r.step for r in self.ranks.values()), default=0)

    @property
    def restarts(self) -> int:
        return sum(1 for h in self.history if h.resumed_ms is not None)

    @property
    def steps_lost(self) -> int:
        return sum(h.steps_lost for h in self.history)

    @property
    def downtime_s(self) -> float:
        """Interrupted -> first step after resume, summed; an open interruption counts up to now."""
        total = 0
        for h in self.history:
            end = h.first_step_ms if h.first_step_ms is not None else self.now_ms
            total += max(end - h.interrupted_ms, 0)
        return total / 1000.0

    @property
    def resumed_from_step(self) -> int | None:
        for h in reversed(self.history):
            if h.resumed_from_step is not None:
                return h.resumed_from_step
        return None

    @property
    def last_step_ms(self) -> int | None:
        """Controller clock (unix ms) when any rank's step last changed; None: no rank moved yet."""
        return max((r.moved_ms for r in self.ranks.values() if r.moved_ms), default=None)

    @property
    def last_restart(self) -> RestartRecord | None:
        return self.history[-1] if self.history else None

    def to_dict(self) -> dict[str, object]:
        last = self.last_restart
        return {
            "job": self.job,
            "state": self.state,
            "nodes": self.nodes,
            "world_size": self.world_size,
            "step": self.step,
            "checkpoint_dir": self.checkpoint_dir,
            "last_complete_step": self.last_complete_step,
            "last_complete_path": self.last_complete_path,
            "restarts": self.restarts,
            "steps_lost": self.steps_lost,
            "downtime_s": self.downtime_s,
            "resumed_from_step": self.resumed_from_step,
            "resumed_from_checkpoint": last.resumed_from_checkpoint if last else None,
            "last_step_ms": self.last_step_ms,
            "ranks": {r.rank: r.node for r in sorted(self.ranks.values(), key=lambda r: r.rank)},
            "phase": self.phase,
            "since_step_s": self.since_step_s,
        }

    @property
    def phase(self) -> str:
        """What the job does: a phase other than training any rank is in (its peers wait on it), else training."""
        phases = {r.phase for r in self.ranks.values() if r.phase}
        for p in ("checkpointing", "evaluating", "starting"):
            if p in phases:
                return p
        return "training" if phases or self.ranks else ""

    @property
    def since_step_s(self) -> float | None:
        """Seconds since any rank's step last changed, as the controller saw it; None: no rank."""
        moved = [r.moved_ms for r in self.ranks.values() if r.moved_ms]
        return round((self.now_ms - max(moved)) / 1000.0, 1) if moved and self.now_ms else None


class JobRegistry:
    """Job -> nodes, ranks, progress, last complete checkpoint and restart accounting."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        clock: Clock,
        persist_interval_ms: int = 30_000,
    ) -> None:
        self._db = conn
        self.clock = clock
        self._clock_ms = clock.time_ms
        self.persist_interval_ms = persist_interval_ms
        self._db.executescript(_SCHEMA)
        self._jobs: dict[str, JobRecord] = {}
        self._persisted_step_ms: dict[tuple[str, int], int] = {}
        # node -> the (job, rank) pairs its last report listed (what "no longer listed" compares to)
        self._listed: dict[str, set[tuple[str, int]]] = {}
        self._load()

    # -- loading and writing --------------------------------------------------------------

    def _load(self) -> None:
        for row in self._db.execute(
            "SELECT job, checkpoint_dir, declared_nodes, world_size, last_complete_step, last_complete_path,"
            " last_complete_ms, state, first_seen_ms, updated_ms FROM heal_jobs"
        ):
            self._jobs[row[0]] = JobRecord(
                job=row[0],
                checkpoint_dir=row[1],
                declared_nodes=list(json.loads(row[2])),
                world_size=row[3],
                last_complete_step=row[4],
                last_complete_path=row[5],
                last_complete_ms=row[6],
                state=row[7],
                first_seen_ms=row[8],
                updated_ms=row[9],
            )
        for row in self._db.execute(
            "SELECT job, rank, node, step, step_time_s, last_checkpoint_step, checkpoint_path,"
            " last_checkpoint_ms, pid, world_size, updated_ms FROM heal_job_ranks"
        ):
            rec = RankRecord(*row)
            job = self._jobs.get(rec.job)
            if job is not None:
                job.ranks[rec.rank] = rec
                self._persisted_step_ms[(rec.job, rec.rank)] = rec.updated_ms
        for row in self._db.execute(
            "SELECT job, interrupted_ms, reason, interrupted_step, resumed_ms, resumed_from_step, first_step_ms,"
            " first_step FROM heal_job_restarts ORDER BY job, interrupted_ms"
        ):
            job = self._jobs.get(row[0])
            if job is not None:
                job.history.append(RestartRecord(*row[1:]))

    def _save_job(self, rec: JobRecord) -> None:
        self._db.execute(
            "INSERT INTO heal_jobs(job, checkpoint_dir, declared_nodes, world_size, last_complete_step,"
            " last_complete_path, last_complete_ms, state, first_seen_ms, updated_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(job) DO UPDATE SET"
            " checkpoint_dir=excluded.checkpoint_dir, declared_nodes=excluded.declared_nodes,"
            " world_size=excluded.world_size, last_complete_step=excluded.last_complete_step,"
            " last_complete_path=excluded.last_complete_path, last_complete_ms=excluded.last_complete_ms,"
            " state=excluded.state, updated_ms=excluded.updated_ms",
            (
                rec.job,
                rec.checkpoint_dir,
                json.dumps(rec.declared_nodes),
                rec.world_size,
                rec.last_complete_step,
                rec.last_complete_path,
                rec.last_complete_ms,
                rec.state,
                rec.first_seen_ms,
                rec.updated_ms,
            ),
        )

    def _save_rank(self, r: RankRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO heal_job_ranks(job, rank, node, step, step_time_s, last_checkpoint_step,"
            " checkpoint_path, last_checkpoint_ms, pid, world_size, updated_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r.job,
                r.rank,
                r.node,
                r.step,
                r.step_time_s,
                r.last_checkpoint_step,
                r.checkpoint_path,
                r.last_checkpoint_ms,
                r.pid,
                r.world_size,
                r.updated_ms,
            ),
        )
        self._persisted_step_ms[(r.job, r.rank)] = r.updated_ms

    def _save_restart(self, job: str, h: RestartRecord) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO heal_job_restarts(job, interrupted_ms, reason, interrupted_step, resumed_ms,"
            " resumed_from_step, first_step_ms, first_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job,
                h.interrupted_ms,
                h.reason,
                h.interrupted_step,
                h.resumed_ms,
                h.resumed_from_step,
                h.first_step_ms,
                h.first_step,
            ),
        )

    def _get_or_create(self, job: str, now: int) -> tuple[JobRecord, bool]:
        rec = self._jobs.get(job)
        if rec is not None:
            return rec, False
        rec = self._jobs[job] = JobRecord(job=job, first_seen_ms=now, updated_ms=now)
        log.info("job_registered", job=job, source="report")
        return rec, True

    # -- declarations -------------------------------------------------------------------

    def register_job(self, job: str, nodes: Iterable[str], checkpoint_dir: str = "", world_size: int = 0) -> JobRecord:
        """Declare a job (scheduler, scenario); replaces its declared nodes, keeps its history."""
        now = self._clock_ms()
        rec = self._jobs.get(job)
        if rec is None:
            rec = self._jobs[job] = JobRecord(job=job, first_seen_ms=now)
        rec.declared_nodes = sorted(set(nodes))
        if checkpoint_dir:
            rec.checkpoint_dir = checkpoint_dir
        if world_size:
            rec.world_size = world_size
        rec.updated_ms = now
        with transaction(self._db):
            self._save_job(rec)
        log.info("job_declared", job=job, nodes=rec.declared_nodes, checkpoint_dir=rec.checkpoint_dir)
        return self._snapshot(rec)

    # -- IngestListener -------------------------------------------------------------------

    def _ranks_gone(self, node_id: str, seen: set[tuple[str, int]]) -> list[tuple[JobRecord, RankRecord]]:
        """Ranks on this node that its report no longer lists.

        Every report asks, so it must not cost a walk over every rank of every job (80,000
        ranks for one job on 10,000 nodes): only the ranks this node listed last time are
        looked at. A node's first report after start walks them all once (ranks restored
        from the database).
        """
        listed_before = self._listed.get(node_id)
        self._listed[node_id] = seen
        if listed_before is None:
            return [
                (rec, r)
                for rec in self._jobs.values()
                for r in list(rec.ranks.values())
                if r.node == node_id and (r.job, r.rank) not in seen
            ]
        gone: list[tuple[JobRecord, RankRecord]] = []
        for job, rank in listed_before - seen:
            rec = self._jobs.get(job)
            r = rec.ranks.get(rank) if rec is not None else None
            if rec is not None and r is not None and r.node == node_id:
                gone.append((rec, r))
        return gone

    def on_report(self, node: NodeRecord, report: WithJobSteps) -> None:
        """Take this node's job ranks from the report (or its verdict); ranks it no longer lists left the node."""
        steps = report.job_steps
        if not steps and self._listed.get(node.node_id) == _NONE_LISTED:
            return  # no ranks before, none now: the common report of a node outside any job
        now = self._clock_ms()
        seen: set[tuple[str, int]] = set()
        dirty_jobs: dict[str, JobRecord] = {}
        dirty_ranks: list[RankRecord] = []
        dirty_restarts: list[tuple[str, RestartRecord]] = []
        for s in steps:
            if not s.job:
                continue
            rec, created = self._get_or_create(s.job, now)
            if created:
                dirty_jobs[s.job] = rec
            key = (s.job, s.rank)
            seen.add(key)
            old = rec.ranks.get(s.rank)
            new = RankRecord(
                job=s.job,
                rank=s.rank,
                node=node.node_id,
                step=s.step,
                step_time_s=s.step_time_s,
                last_checkpoint_step=s.last_checkpoint_step,
                checkpoint_path=s.checkpoint_path,
                last_checkpoint_ms=s.last_checkpoint_ms,
                pid=s.pid,
                world_size=s.world_size,
                updated_ms=now,
                resumed_from_step=s.resumed_from_step,
                phase=s.phase,
                phase_since_ms=s.phase_since_ms,
                moved_ms=now if old is None or old.step != s.step else old.moved_ms,
            )
            self._note_progress(rec, old, new, now, dirty_restarts, dirty_jobs)
            rec.ranks[s.rank] = new
            durable_change = old is None or (
                old.node,
                old.pid,
                old.world_size,
                old.last_checkpoint_step,
                old.checkpoint_path,
            ) != (new.node, new.pid, new.world_size, new.last_checkpoint_step, new.checkpoint_path)
            if durable_change or now - self._persisted_step_ms.get(key, 0) >= self.persist_interval_ms:
                dirty_ranks.append(new)
            if s.world_size and s.world_size != rec.world_size:
                rec.world_size = s.world_size
                dirty_jobs[s.job] = rec
            if self._advance_checkpoint(rec, now):
                dirty_jobs[s.job] = rec
        gone = self._ranks_gone(node.node_id, seen)
        if not (dirty_jobs or dirty_ranks or dirty_restarts or gone):
            return
        with transaction(self._db):
            for rec, r in gone:
                del rec.ranks[r.rank]
                self._persisted_step_ms.pop((r.job, r.rank), None)
                self._db.execute("DELETE FROM heal_job_ranks WHERE job=? AND rank=?", (r.job, r.rank))
                log.info("job_rank_left", job=r.job, rank=r.rank, node=node.node_id)
            for r in dirty_ranks:
                self._save_rank(r)
            for job, h in dirty_restarts:
                self._save_restart(job, h)
            for rec in dirty_jobs.values():
                rec.updated_ms = now
                self._save_job(rec)

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        return None

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        return None

    def progress(self, job: str, step: int, at_ms: int, phase: str = "") -> JobProgress:
        """A job-level progress sample; an older one than the latest (by ``at_ms``) is ignored.

        Kept in memory: a restarted controller hears the next one (a job reports often).
        """
        now = self._clock_ms()
        rec, created = self._get_or_create(job, now)
        if created:
            with transaction(self._db):
                self._save_job(rec)
        if rec.progress is None or at_ms >= rec.progress.at_ms:
            rec.progress = JobProgress(step=step, at_ms=at_ms, phase=phase, received_ms=now)
        return rec.progress

    def _note_progress(
        self,
        rec: JobRecord,
        old: RankRecord | None,
        new: RankRecord,
        now: int,
        dirty_restarts: list[tuple[str, RestartRecord]],
        dirty_jobs: dict[str, JobRecord],
    ) -> None:
        """After a resume, the first step past the checkpoint ends the downtime.

        A rank that merely repeats what it said before (a stale sample from the old
        node, a registration without steps) is not progress.
        """
        if rec.state != RESUMING or not rec.history:
            return
        h = rec.history[-1]
        if h.resumed_from_step is None or h.first_step_ms is not None:
            return
        new_run = old is None or old.pid != new.pid or old.node != new.node
        if new_run and new.resumed_from_step > 0:
            # The job itself says where it restarted from: that, not what we expected when we
            # requeued it, is the resume point (it may have checkpointed again while stopping).
            h.resumed_from_step = new.resumed_from_step
        if new.step <= h.resumed_from_step:
            return
        if old is not None and (old.step, old.pid, old.node) == (new.step, new.pid, new.node):
            return
        h.first_step_ms = now
        h.first_step = new.step
        rec.state = RUNNING
        dirty_restarts.append((rec.job, h))
        dirty_jobs[rec.job] = rec
        log.info(
            "job_resumed_running",
            job=rec.job,
            first_step=new.step,
            resumed_from_step=h.resumed_from_step,
            from_checkpoint=h.resumed_from_checkpoint,
            downtime_s=(now - h.interrupted_ms) / 1000.0,
            steps_lost=h.steps_lost,
        )

    def _advance_checkpoint(self, rec: JobRecord, now: int) -> bool:
        """Move the job's last complete checkpoint to the min over its ranks, when all reported."""
        world = rec.world_size or len(rec.ranks)
        ranks = [rec.ranks.get(i) for i in range(world)]
        if world == 0 or any(r is None for r in ranks):
            return False
        present = [r for r in ranks if r is not None]
        low = min(present, key=lambda r: r.last_checkpoint_step)
        if low.last_checkpoint_step <= rec.last_complete_step:
            return False
        rec.last_complete_step = low.last_checkpoint_step
        rec.last_complete_path = low.checkpoint_path
        rec.last_complete_ms = max(r.last_checkpoint_ms for r in present) or now
        log.info("job_checkpoint_complete", job=rec.job, step=rec.last_complete_step, path=rec.last_complete_path)
        return True

    # -- interruption and resume -------------------------------------------------------------

    def mark_interrupted(self, job: str, at_ms: int, reason: str) -> JobRecord:
        """The job stopped (evicted, node lost). Idempotent while it is still down."""
        rec, _ = self._get_or_create(job, at_ms)
        if rec.state in (INTERRUPTED, RESUMING):
            log.info("job_interrupted_again", job=job, reason=reason)
            return self._snapshot(rec)
        h = RestartRecord(interrupted_ms=at_ms, reason=reason, interrupted_step=rec.step)
        rec.history.append(h)
        rec.state = INTERRUPTED
        rec.updated_ms = at_ms
        with transaction(self._db):
            self._save_restart(job, h)
            self._save_job(rec)
        log.info(
            "job_interrupted",
            job=job,
            reason=reason,
            step=h.interrupted_step,
            last_complete_step=rec.last_complete_step,
        )
        return self._snapshot(rec)

    def mark_resumed(self, job: str, at_ms: int, resumed_from_step: int) -> JobRecord:
        """The job was restarted (requeued, or on a spare) from `resumed_from_step`.

        Counts a restart and its steps lost; downtime ends at the first step report after this.
        """
        rec, _ = self._get_or_create(job, at_ms)
        if rec.state == INTERRUPTED and rec.history:
            h = rec.history[-1]
        elif rec.state == RESUMING and rec.history and rec.history[-1].first_step_ms is None:
            # Requeued again before its first step (a hang naming two nodes: one requeue per
            # eviction): the same interruption, its steps lost counted once.
            h = rec.history[-1]
        else:  # resumed without a recorded interruption (e.g. the scheduler restarted it): count it anyway
            h = RestartRecord(interrupted_ms=at_ms, reason="unrecorded", interrupted_step=rec.step)
            rec.history.append(h)
        h.resumed_ms = at_ms
        h.resumed_from_step = resumed_from_step
        rec.state = RESUMING
        rec.updated_ms = at_ms
        with transaction(self._db):
            self._save_restart(job, h)
            self._save_job(rec)
        log.info(
            "job_restarted",
            job=job,
            resumed_from_step=resumed_from_step,
            steps_lost=h.steps_lost,
            restarts=rec.restarts,
        )
        return self._snapshot(rec)

    # -- queries --------------------------------------------------------------------------

    def _snapshot(self, rec: JobRecord) -> JobRecord:
        return replace(
            rec,
            declared_nodes=list(rec.declared_nodes),
            ranks={k: replace(v) for k, v in rec.ranks.items()},
            history=[replace(h) for h in rec.history],
            now_ms=self._clock_ms(),
        )

    def live(self) -> list[JobRecord]:
        """The registry's own records, not copies: for readers on this floor and above that only
        read (hang detection looks at every rank every few seconds; copying 80,000 would cost more)."""
        return list(self._jobs.values())

    def jobs(self) -> list[JobRecord]:
        return [self._snapshot(self._jobs[name]) for name in sorted(self._jobs)]

    def job(self, name: str) -> JobRecord | None:
        rec = self._jobs.get(name)
        return self._snapshot(rec) if rec is not None else None

    def nodes_of(self, job: str) -> list[str]:
        rec = self._jobs.get(job)
        return rec.nodes if rec is not None else []

    def first_job_by_node(self) -> dict[str, str]:
        """node -> ``jobs_of(node)[0]`` for every node at once: one pass over the jobs' declared
        nodes and ranks, where asking ``jobs_of`` per node walks every job's ranks per node
        (the fail-slow peer map, controller.detect.pipeline)."""
        out: dict[str, str] = {}
        for name in sorted(self._jobs, reverse=True):  # the first name (what jobs_of sorts first) writes last
            rec = self._jobs[name]
            for node in rec.declared_nodes:
                out[node] = name
            for r in rec.ranks.values():
                out[r.node] = name
        return out

    def jobs_of(self, node: str) -> list[str]:
        # Not ``rec.nodes`` (a sorted copy of every node of the job, per job, per call): this is
        # asked per condition and per eviction, O(nodes log nodes) each at 2,048-node jobs.
        return sorted(
            name
            for name, rec in self._jobs.items()
            if node in rec.declared_nodes or any(r.node == node for r in rec.ranks.values())
        )
