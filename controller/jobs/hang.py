"""Hang detection from the job's own steps: a job whose steps stop moving is hung.

Decided on the jobs floor, above detection: it reads the job registry's per-rank samples
(``JobStepSample`` in every report, ``controller.jobs.registry``), which detection below it
cannot import. Its verdicts are conditions in detection's vocabulary (rule ``job_hang``,
category ``hang``) that the decision core hands to the correlator through
``Detection.feed``, where they become ``job_hang`` incidents (controller.core).

What counts as moving, per rank, on the controller's clock: its step rose, or it entered
another phase (``starting``, ``training``, ``checkpointing``, ``evaluating``, from
``starpulse.job``). A rank that has not moved for longer than its job's bound is stalled:

- training: ``clamp(k x the median of the job's recent step times, floor_s, cap_s)``, so a
  job's own pace sets how long a silence means something;
- checkpointing, evaluating and starting have bounds of their own (a large checkpoint or
  an evaluation pass takes minutes and says so by its phase). While any rank of a job is
  in such a phase, its peers wait on it: the job's bound is the largest of its ranks'.

Verdicts: every rank stalled is a hang (``stalled``), and ranks whose step is behind the
others' are named as suspects (they never reached the step their peers finished); ranks
stalled behind the others while those move on is a divergence (``diverged``), the stalled
ones named. Ranks stalled at the same step as the others are never named alone: a whole
job stopping is seen rank by rank as reports arrive, and the first seen are waiters.

A lost progress signal is never a hang: a rank's stillness is counted from its last move to
the last report that listed it, never to now, and a rank that no report listed for ``signal_lost_s``
(its agent restarted, its node went silent) is forgotten, and when it is back its clock
starts over; a new run of a rank (another pid, another node, a lower step) starts over too.
A rank that merely slows down keeps moving and is fail-slow's business, not this one's.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.detect.model import Condition, ConditionChange
from controller.jobs.registry import ENDED, INTERRUPTED, JobRecord, RankRecord
from controller.jobs.stacks import StackVerdict
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.core.schema import setting

log = structlog.get_logger(__name__)

RULE = "job_hang"
CATEGORY = "hang"
STARTING = "starting"
TRAINING = "training"
CHECKPOINTING = "checkpointing"
EVALUATING = "evaluating"


@dataclass
class HangConfig:
    """The bounds a job's silence is judged against: rules as data, each with its reason."""

    every_s: float = setting(
        5.0, "Seconds between hang checks: a hang is seen within this of its bound, plus one report interval", gt=0
    )
    k: float = setting(
        5.0,
        "Multiple of the job's median step time a training rank may go without a step: data loading "
        "and logging make single steps two or three times the median, never five",
        gt=1,
    )
    floor_s: float = setting(
        20.0,
        "Seconds: the least a training rank may go without a step whatever its step time, so a "
        "sub-second step is not judged on one report's jitter (reports every 5 s)",
        gt=0,
    )
    cap_s: float = setting(
        300.0,
        "Seconds: the most a training rank may go without a step, however slow its steps; half of "
        "PyTorch's NCCL timeout (600 s), so we see it before the watchdog kills the job",
        gt=0,
    )
    median_steps: int = setting(
        32, "Recent step times of a job its median is taken over (each rank's reported moving average)", ge=1
    )
    starting_s: float = setting(
        900.0,
        "Seconds a rank may stay 'starting' (registered, no step yet): loading a large model and "
        "initialising NCCL over thousands of ranks take minutes",
        gt=0,
    )
    checkpointing_s: float = setting(
        900.0,
        "Seconds a rank may stay 'checkpointing': a large model's state to remote storage takes minutes; "
        "a checkpoint that takes longer is stuck in its I/O or a collective",
        gt=0,
    )
    evaluating_s: float = setting(
        1800.0, "Seconds a rank may stay 'evaluating': an evaluation pass over a held-out set", gt=0
    )
    signal_lost_s: float = setting(
        30.0,
        "Seconds a rank may go unlisted by its node's reports before its signal counts as lost (agent "
        "or socket restart, node silent): it is then forgotten, never judged hung, and starts over",
        gt=0,
    )
    min_lag_steps: int = setting(
        1, "Steps a stalled rank must be behind the job's furthest rank to be named as a suspect", ge=1
    )
    stacks_timeout_s: float = setting(
        30.0,
        "Seconds each node of a hung job has to answer with its ranks' stacks (py-spy takes well under a "
        "second per process; the flight recorder's dump a few)",
        gt=0,
    )

    def __post_init__(self) -> None:
        if self.floor_s > self.cap_s:
            raise ValueError(f"floor_s ({self.floor_s:g}) must not exceed cap_s ({self.cap_s:g})")


@dataclass(slots=True)
class _Track:
    """One rank as last judged: what it said and when (controller clock) it last moved."""

    node: str
    pid: int
    step: int
    phase: str
    phase_since_ms: int
    moved_ms: int


@dataclass(frozen=True)
class HangVerdict:
    """A job that stopped moving: its shape, bound, the ranks stalled and the suspects."""

    job: str
    shape: str  # "stalled" (every rank) or "diverged" (some ranks, the others move)
    bound_s: float
    stalled_s: float  # the longest any stalled rank has not moved
    median_step_s: float | None
    phase: str  # the job's phase: the one whose bound applies
    step: int  # the furthest step of any rank
    ranks: list[dict[str, Any]]  # every judged rank: rank, node, step, phase, since_move_s
    suspects: list[dict[str, Any]] = field(default_factory=list)  # rank, node, step

    @property
    def suspect_nodes(self) -> list[str]:
        return sorted({str(s["node"]) for s in self.suspects})

    @property
    def nodes(self) -> list[str]:
        return sorted({str(r["node"]) for r in self.ranks})

    def message(self) -> str:
        head = (
            f"job {self.job} has not moved for {self.stalled_s:.0f}s (bound {self.bound_s:.0f}s, "
            f"phase {self.phase}, step {self.step})"
        )
        if self.shape == "diverged":
            head = (
                f"job {self.job}: {len(self.suspects)} rank(s) stopped at their step for {self.stalled_s:.0f}s "
                f"while the others move (bound {self.bound_s:.0f}s)"
            )
        if self.suspects:
            named = ", ".join(f"rank {s['rank']} on {s['node']} at step {s['step']}" for s in self.suspects[:8])
            return f"{head}; behind: {named}"
        return f"{head}; every rank stopped at the same step: no rank named"

    def evidence(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "shape": self.shape,
            "source": "job_library",
            "bound_s": round(self.bound_s, 1),
            "stalled_s": round(self.stalled_s, 1),
            "median_step_s": round(self.median_step_s, 4) if self.median_step_s is not None else None,
            "phase": self.phase,
            "step": self.step,
            "nodes": self.nodes,
            "suspects": self.suspects,  # the stacks' outliers replace them when they name any
            "step_suspects": self.suspects,  # whom the step counters name (behind the others)
            "suspect_nodes": self.suspect_nodes,
            "ranks": self.ranks[:256],
        }


class HangDetector:
    """Judges every job of the registry on each ``evaluate``; see the module docstring."""

    def __init__(self, config: HangConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._tracks: dict[str, dict[int, _Track]] = {}
        self._steps: dict[str, deque[float]] = {}
        self._open: dict[str, Condition] = {}
        self._stacks: dict[str, StackVerdict] = {}  # job -> its ranks' stacks, grouped (controller.jobs.stacks)
        self._last_check = float("-inf")

    # -- bounds ---------------------------------------------------------------------------

    def median_step_s(self, job: str) -> float | None:
        recent = self._steps.get(job)
        return statistics.median(recent) if recent else None

    def bound_s(self, job: str, phase: str) -> float:
        """How long a rank of ``job`` in ``phase`` may go without moving."""
        cfg = self.config
        if phase == CHECKPOINTING:
            return cfg.checkpointing_s
        if phase == EVALUATING:
            return cfg.evaluating_s
        median = self.median_step_s(job)
        if phase == STARTING or median is None:
            return cfg.starting_s  # no step time known yet: the job is still starting
        return min(max(cfg.k * median, cfg.floor_s), cfg.cap_s)

    # -- evaluation -----------------------------------------------------------------------

    def due(self) -> bool:
        """True once every ``every_s`` (the clock starts over)."""
        now = self.clock.monotonic()
        if now - self._last_check < self.config.every_s:
            return False
        self._last_check = now
        return True

    def evaluate(self, jobs: Iterable[JobRecord]) -> list[ConditionChange]:
        """Judge each job; open, update or resolve its ``job_hang`` condition."""
        now = self.clock.time_ms()
        changes: list[ConditionChange] = []
        seen: set[str] = set()
        for rec in jobs:
            seen.add(rec.job)
            if rec.state in (INTERRUPTED, ENDED):
                self._tracks.pop(rec.job, None)  # stopped by us or the scheduler, or over: nothing to hang
                changes += self._resolve(rec.job, now, "job interrupted" if rec.state == INTERRUPTED else "job ended")
                continue
            live = self._observe(rec, now)
            if not rec.ranks:
                changes += self._resolve(rec.job, now, "job has no ranks")
                continue
            if not live:
                continue  # every rank's signal lost: no verdict either way
            verdict = self._judge(rec.job, live, now)
            if verdict is None:
                changes += self._resolve(rec.job, now, "ranks move")
            else:
                changes += self._raise(verdict, now)
        for job in [j for j in self._tracks if j not in seen]:
            del self._tracks[job]
            self._steps.pop(job, None)
        for job in [j for j in self._open if j not in seen]:
            changes += self._resolve(job, now, "job gone")
        return changes

    def since_move_s(self, job: str) -> float | None:
        """Seconds since any rank of ``job`` last moved (controller clock); None: not tracked."""
        tracks = self._tracks.get(job)
        if not tracks:
            return None
        return (self.clock.time_ms() - max(t.moved_ms for t in tracks.values())) / 1000.0

    def active(self) -> list[Condition]:
        return [self._open[j] for j in sorted(self._open)]

    def _observe(self, rec: JobRecord, now: int) -> list[tuple[RankRecord, _Track]]:
        """Update each rank's track; the ranks whose signal is live, with their tracks."""
        lost_ms = int(self.config.signal_lost_s * 1000)
        tracks = self._tracks.setdefault(rec.job, {})
        steps = self._steps.get(rec.job)
        if steps is None:
            steps = self._steps[rec.job] = deque(maxlen=self.config.median_steps)
        live: list[tuple[RankRecord, _Track]] = []
        append, get = live.append, tracks.get
        samples = self.config.median_steps  # step times taken per evaluation: enough for the median
        # The hot loop of a hang check (80,000 ranks at 10,000 nodes): reads and compares only.
        for r in rec.ranks.values():
            if now - r.updated_ms > lost_ms:
                if tracks.pop(r.rank, None) is not None:
                    log.info("job_progress_signal_lost", job=rec.job, rank=r.rank, node=r.node)
                continue
            t = get(r.rank)
            step = r.step
            if t is None or t.pid != r.pid or t.node != r.node or step < t.step:
                t = tracks[r.rank] = _Track(r.node, r.pid, step, r.phase, r.phase_since_ms, now)
            elif step > t.step:
                if samples and r.step_time_s > 0:
                    steps.append(r.step_time_s)
                    samples -= 1
                t.step, t.phase, t.phase_since_ms, t.moved_ms = step, r.phase, r.phase_since_ms, now
            elif r.phase_since_ms != t.phase_since_ms or r.phase != t.phase:
                t.phase, t.phase_since_ms, t.moved_ms = r.phase, r.phase_since_ms, now
            append((r, t))
        if len(tracks) > len(live):
            for rank in [k for k in tracks if k not in rec.ranks]:
                del tracks[rank]
        return live

    def _judge(self, job: str, live: list[tuple[RankRecord, _Track]], now: int) -> HangVerdict | None:
        phases = {r.phase or TRAINING for r, _ in live}
        phase = max(phases, key=lambda p: self.bound_s(job, p))
        bound = self.bound_s(job, phase)
        bound_ms = int(bound * 1000)
        # A rank is seen not moving from its last move up to the last report that listed it, never
        # up to now: while its reports do not come, its silence says nothing about its steps.
        if max(r.updated_ms - t.moved_ms for r, t in live) <= bound_ms:
            return None  # the common case, in one pass
        stalled = [(r, t) for r, t in live if r.updated_ms - t.moved_ms > bound_ms]
        top = max(r.step for r, _ in live)
        ranks = [
            {"rank": r.rank, "node": r.node, "step": r.step, "phase": r.phase or TRAINING,
             "since_move_s": round((r.updated_ms - t.moved_ms) / 1000.0, 1)}
            for r, t in sorted(live, key=lambda rt: rt[0].rank)
        ]  # fmt: skip
        behind = [r for r, _ in stalled if top - r.step >= self.config.min_lag_steps]
        if len(stalled) == len(live):
            shape = "stalled"
            named = behind
        elif behind:
            shape = "diverged"
            named = behind
        else:
            # Some ranks past the bound, the rest not yet, all at the same step: the whole job
            # stopping, seen through reports that arrive at different moments. Naming the ranks
            # whose report came first would blame waiters; wait for the others.
            return None
        suspects = [{"rank": r.rank, "node": r.node, "step": r.step} for r in sorted(named, key=lambda r: r.rank)]
        return HangVerdict(
            job=job,
            shape=shape,
            bound_s=bound,
            stalled_s=max(r.updated_ms - t.moved_ms for r, t in stalled) / 1000.0,
            median_step_s=self.median_step_s(job),
            phase=phase,
            step=top,
            ranks=ranks,
            suspects=suspects,
        )

    # -- conditions -----------------------------------------------------------------------

    def annotate(self, job: str, stacks: StackVerdict) -> list[ConditionChange]:
        """The ranks' stacks of a hung job: the groups join its evidence, and the outliers, when
        the stacks name any, are its suspects (they say more than a step counter)."""
        cond = self._open.get(job)
        if cond is None:
            return []  # resolved while the stacks were collected
        stacks.at_ms = self.clock.time_ms()
        self._stacks[job] = stacks
        evidence = dict(cond.evidence)  # a new dict: the incident's summary holds the old one
        self._with_stacks(job, evidence)
        cond.evidence = evidence
        nodes = evidence["suspect_nodes"]
        cond.node = nodes[0] if len(nodes) == 1 else None
        cond.message = f"{cond.message.split('; stacks:')[0]}; stacks: {stacks.reason}"
        log.warning("job_hang_stacks", job=job, reason=stacks.reason, outliers=nodes)
        return [ConditionChange("updated", cond)]

    def _with_stacks(self, job: str, evidence: dict[str, Any]) -> None:
        stacks = self._stacks.get(job)
        if stacks is None:
            return
        evidence["stacks"] = {**stacks.to_evidence(), "at_ms": stacks.at_ms}
        if stacks.outliers:
            evidence["suspects"] = [{"rank": o.rank, "node": o.node, "pid": o.pid} for o in stacks.outliers]
            evidence["suspect_nodes"] = sorted({o.node for o in stacks.outliers})
            evidence["suspects_from"] = "stacks"

    def _raise(self, v: HangVerdict, now: int) -> list[ConditionChange]:
        evidence = v.evidence()
        self._with_stacks(v.job, evidence)
        nodes = list(evidence["suspect_nodes"])
        cond = self._open.get(v.job)
        if cond is None:
            cond = self._open[v.job] = Condition(
                rule=RULE,
                component=f"job:{v.job}",
                component_type="job",
                category=CATEGORY,
                node=nodes[0] if len(nodes) == 1 else None,
                severity="critical",
                action=vocab.ACTION_RESTART_APP,
                message=v.message(),
                first_seen_ms=now,
                last_seen_ms=now,
                evidence=evidence,
            )
            log.warning(
                "job_hang_detected",
                job=v.job,
                shape=v.shape,
                bound_s=v.bound_s,
                stalled_s=v.stalled_s,
                phase=v.phase,
                step=v.step,
                suspects=nodes,
            )
            return [ConditionChange("opened", cond)]
        before = (cond.evidence.get("suspects"), cond.evidence.get("shape"))
        cond.last_seen_ms = now
        cond.count += 1
        cond.evidence = evidence
        stacks = self._stacks.get(v.job)
        cond.message = v.message() + (f"; stacks: {stacks.reason}" if stacks is not None else "")
        cond.node = nodes[0] if len(nodes) == 1 else None
        if (evidence["suspects"], evidence["shape"]) != before:
            return [ConditionChange("updated", cond)]
        return []

    def _resolve(self, job: str, now: int, why: str) -> list[ConditionChange]:
        self._stacks.pop(job, None)
        cond = self._open.pop(job, None)
        if cond is None:
            return []
        cond.resolved_ms = now
        cond.evidence = {**cond.evidence, "resolved_because": why}
        log.info("job_hang_cleared", job=job, why=why)
        return [ConditionChange("resolved", cond)]
