"""Fleet reliability in numbers, from the controller's own history (issue 28 item 1).

Everything here is read from SQLite rows the controller keeps anyway (incidents, the
remediation transitions and repairs, the job registry's restarts and ranks) plus the
``fleet_service`` intervals that give the GPU-days denominator; raw events are never read,
so the figures survive the events' expiry. The same function answers on the leader and on
an HA standby (whose tables are the mirror's copy). Definitions: docs/reliability.md.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.heal.inservice import service_intervals

DAY_MS = 86_400_000

# Causes in the order the report prints them (the Llama 3 table's buckets, folded).
CAUSES = ("gpu", "hbm_ecc", "nvlink", "nic", "switch_cable", "host", "fail_slow", "hang", "software_job", "other")
_KIND_CAUSE = {
    "gpu_fault": "gpu",
    "nic_fault": "nic",
    "switch_fault": "switch_cable",
    "link_fault": "switch_cable",
    "partition": "switch_cable",
    "host_fault": "host",
    "node_fault": "host",
    "node_down": "host",
    "straggler": "fail_slow",
    "hang": "hang",
    "job_hang": "hang",
}
_HBM_RULES = ("gpu.ecc_dbe", "gpu.remap_pending", "gpu.remap_failure")
_OUT_OF_POOL = ("cordoned", "draining", "evicted")
_BACK_IN_POOL = ("in_service", "spare")


@dataclass(frozen=True)
class ReportSettings:
    """The report's stated thresholds (flags of ``starpulse report``; documented defaults)."""

    clean_s: float = 7 * 86400.0  # a returned node must run this long without an incident (wrongful eviction)
    lemon_faults: int = 3  # faults within the lemon window that make a node a lemon
    lemon_window_s: float = 28 * 86400.0  # Kokolis et al. threshold their lemon signals over 28 days
    # A node returned 'validated' that fails again with the same cause within this long was a false
    # success of the validation: a day covers the next training day's load (a reset or reboot hides
    # a fault for hours, seldom for a day), and stays inside the ladder's 7-day lemon window.
    false_success_s: float = 86400.0


def cause_of(kind: str, evidence: Iterable[dict[str, Any]]) -> str:
    """The report's cause bucket for an incident: its kind, refined by its rules for GPU faults."""
    cause = _KIND_CAUSE.get(kind, "other")
    if cause == "gpu":
        rules = [str(e.get("rule", "")) for e in evidence]
        if any(r in _HBM_RULES for r in rules):
            return "hbm_ecc"
        if any("nvlink" in r or "sxid" in r for r in rules):
            return "nvlink"
    return cause


@dataclass
class _Incident:
    id: str
    kind: str
    cause: str
    nodes: list[str]
    jobs: list[str]
    opened_ms: int
    resolved_ms: int | None


@dataclass
class JobFigures:
    """One job's reliability over the window (see docs/reliability.md for each field)."""

    job: str
    gpus: int
    basis: str  # "steps" (job library: step times known), "scheduler" (restarts only), "none"
    wall_s: float
    downtime_s: float
    redo_s: float | None  # recomputing lost steps; None: unknown (no step times)
    interruptions: int
    steps_lost: int
    ettr: float | None
    ettr_is_upper_bound: bool
    mean_time_between_interruptions_s: float | None
    gpu_hours_lost: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FleetReport:
    since_ms: int
    until_ms: int
    node_days: float
    gpu_days: float
    nodes_in_service: int
    gpus_in_service: int
    faults: int
    by_cause: dict[str, int]
    mtbf_fleet_h: float | None
    mtbf_node_h: float | None
    mttr_pool_s: list[float]
    still_out: int
    mttr_job_s: list[float]
    jobs: list[JobFigures]
    evictions: int
    wrongful: list[dict[str, Any]]
    wrongful_pending: int
    wrongful_unknown: int
    lemons: list[dict[str, Any]]
    settings: ReportSettings = field(default_factory=ReportSettings)
    wrongful_earlier: int = 0  # wrongful evictions of days kept only as daily aggregates
    validated_returns: int = 0  # nodes the repair ladder returned after a passed validation
    false_validations: list[dict[str, Any]] = field(default_factory=list)  # of those, failed again (same cause)
    false_validation_pending: int = 0  # returns whose false-success window has not ended
    validated_earlier: int = 0  # validated returns of days kept only as daily aggregates
    false_validations_earlier: int = 0  # and their false successes

    @property
    def false_validation_share(self) -> float | None:
        """False successes over the validated returns whose window ended; None: none yet."""
        judged = self.validated_returns + self.validated_earlier - self.false_validation_pending
        bad = len(self.false_validations) + self.false_validations_earlier
        return bad / judged if judged > 0 else None

    # -- derived ----------------------------------------------------------------------------
    def per_1000_gpu_days(self, n: int) -> float | None:
        return 1000.0 * n / self.gpu_days if self.gpu_days > 0 else None

    def per_1000_node_days(self, n: int) -> float | None:
        return 1000.0 * n / self.node_days if self.node_days > 0 else None

    @property
    def fleet_ettr(self) -> float | None:
        """GPU-weighted ETTR over jobs whose ETTR could be given."""
        known = [j for j in self.jobs if j.ettr is not None and j.wall_s > 0]
        weight = sum(j.gpus * j.wall_s for j in known)
        if not weight:
            return None
        return sum(j.gpus * j.wall_s * (j.ettr or 0.0) for j in known) / weight

    def to_dict(self) -> dict[str, Any]:
        def summary(values: list[float]) -> dict[str, Any]:
            return {
                "count": len(values),
                "mean_s": statistics.fmean(values) if values else None,
                "median_s": statistics.median(values) if values else None,
                "max_s": max(values) if values else None,
            }

        return {
            "window": {
                "since_ms": self.since_ms,
                "until_ms": self.until_ms,
                "days": (self.until_ms - self.since_ms) / DAY_MS,
            },
            "fleet": {
                "node_days": self.node_days,
                "gpu_days": self.gpu_days,
                "nodes_in_service": self.nodes_in_service,
                "gpus_in_service": self.gpus_in_service,
            },
            "faults": {
                "total": self.faults,
                "per_1000_gpu_days": self.per_1000_gpu_days(self.faults),
                "per_1000_node_days": self.per_1000_node_days(self.faults),
                "by_cause": {
                    c: {
                        "count": self.by_cause.get(c, 0),
                        "per_1000_gpu_days": self.per_1000_gpu_days(self.by_cause.get(c, 0)),
                        "per_1000_node_days": self.per_1000_node_days(self.by_cause.get(c, 0)),
                    }
                    for c in CAUSES
                },
            },
            "mtbf_h": {"fleet": self.mtbf_fleet_h, "node": self.mtbf_node_h},
            "mttr": {
                "fault_to_node_back_in_pool": {**summary(self.mttr_pool_s), "still_out": self.still_out},
                "fault_to_job_resumed": summary(self.mttr_job_s),
            },
            "ettr": {"fleet": self.fleet_ettr, "jobs": [j.to_dict() for j in self.jobs]},
            "lost": {
                "steps": sum(j.steps_lost for j in self.jobs),
                "gpu_hours": sum(j.gpu_hours_lost for j in self.jobs),
            },
            "evictions": {
                "total": self.evictions,
                "wrongful": len(self.wrongful) + self.wrongful_earlier,
                "wrongful_nodes": self.wrongful,
                "pending": self.wrongful_pending,
                "unknown": self.wrongful_unknown,
                "clean_s": self.settings.clean_s,
            },
            "lemons": {
                "threshold_faults": self.settings.lemon_faults,
                "window_s": self.settings.lemon_window_s,
                "nodes": self.lemons,
            },
            "validation": {
                "returns": self.validated_returns + self.validated_earlier,
                "false_successes": len(self.false_validations) + self.false_validations_earlier,
                "share": self.false_validation_share,
                "pending": self.false_validation_pending,
                "window_s": self.settings.false_success_s,
                "false_success_returns": self.false_validations,
            },
        }


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # a controller without self-healing (or jobs) lacks the table
        return []


def _incidents(conn: sqlite3.Connection, since_ms: int, until_ms: int) -> list[_Incident]:
    """Incidents opened in the window that stand on their own (merged ones are counted once, in their host)."""
    out = []
    for id_, kind, nodes, jobs, evidence, opened, resolved in _rows(
        conn,
        "SELECT id, kind, affected_nodes, affected_jobs, evidence, opened_ms, resolved_ms FROM incidents "
        "WHERE merged_into IS NULL AND opened_ms >= ? AND opened_ms < ? ORDER BY opened_ms",
        (since_ms, until_ms),
    ):
        out.append(
            _Incident(id_, kind, cause_of(kind, json.loads(evidence)), json.loads(nodes), json.loads(jobs), opened,
                      resolved)
        )  # fmt: skip
    return out


def fleet_report(
    conn: sqlite3.Connection,
    since_ms: int,
    until_ms: int,
    settings: ReportSettings | None = None,
    as_of_ms: int | None = None,
) -> FleetReport:
    """The reliability figures for [since_ms, until_ms), from ``conn``'s tables alone.

    ``as_of_ms`` (default ``until_ms``): what is known by then judges what happened in the window
    (a false success of validation is seen after its return); the aggregation of a past day passes
    its cutoff, so a return late in the day is judged, not pending."""
    settings = settings or ReportSettings()
    intervals = service_intervals(conn, since_ms, until_ms)
    node_ms = sum(i.overlap_ms(since_ms, until_ms) for i in intervals)
    gpu_ms = sum(i.overlap_ms(since_ms, until_ms) * i.gpus for i in intervals)
    open_now = [i for i in intervals if i.to_ms is None or i.to_ms >= until_ms]
    incidents = _incidents(conn, since_ms, until_ms)
    by_cause: dict[str, int] = defaultdict(int)
    for inc in incidents:
        by_cause[inc.cause] += 1
    jobs, job_mttr, software = _job_figures(conn, since_ms, until_ms, incidents, intervals)
    by_cause["software_job"] += software
    faults = len(incidents) + software
    mttr_pool, still_out, evictions, wrongful, pending, unknown = _pool_figures(conn, incidents, until_ms, settings)
    returns, false_validations, false_pending = validation_figures(
        conn, since_ms, until_ms, settings.false_success_s, until_ms if as_of_ms is None else as_of_ms
    )
    lemons = annotate_lemons(
        _lemons(conn, until_ms, settings), conn, until_ms - int(settings.lemon_window_s * 1000), until_ms, settings
    )
    return FleetReport(
        since_ms=since_ms,
        until_ms=until_ms,
        node_days=node_ms / DAY_MS,
        gpu_days=gpu_ms / DAY_MS,
        nodes_in_service=len(open_now),
        gpus_in_service=sum(i.gpus for i in open_now),
        faults=faults,
        by_cause={c: n for c, n in by_cause.items() if n},
        mtbf_fleet_h=(until_ms - since_ms) / 3_600_000 / faults if faults else None,
        mtbf_node_h=node_ms / 3_600_000 / faults if faults else None,
        mttr_pool_s=mttr_pool,
        still_out=still_out,
        mttr_job_s=job_mttr,
        jobs=jobs,
        evictions=evictions,
        wrongful=wrongful,
        wrongful_pending=pending,
        wrongful_unknown=unknown,
        lemons=lemons,
        settings=settings,
        validated_returns=returns,
        false_validations=false_validations,
        false_validation_pending=false_pending,
    )


def validation_figures(
    conn: sqlite3.Connection, since_ms: int, until_ms: int, window_s: float, as_of_ms: int
) -> tuple[int, list[dict[str, Any]], int]:
    """Validated returns in [since_ms, until_ms), those that were false successes, and those pending.

    A validated return is the repair ladder's move of a node from ``validating`` back to
    ``in_service`` or ``spare`` for an incident. It was a false success when an incident naming the
    node with the same cause (the report's cause buckets) opened within ``window_s`` after it:
    the validation passed a node whose fault was still there. A return with no such incident
    whose window is not over at ``as_of_ms`` is pending (neither counted bad nor good yet).
    """
    window_ms = int(window_s * 1000)
    returns = _rows(
        conn,
        "SELECT t.node, t.incident_id, t.at_ms, i.kind, i.evidence FROM heal_transitions t "
        "LEFT JOIN incidents i ON i.id = t.incident_id WHERE t.from_state = 'validating' "
        "AND t.to_state IN ('in_service', 'spare') AND t.at_ms >= ? AND t.at_ms < ? ORDER BY t.at_ms, t.id",
        (since_ms, until_ms),
    )
    false: list[dict[str, Any]] = []
    pending = 0
    for node, incident_id, back, kind, evidence in returns:
        cause = cause_of(kind, json.loads(evidence)) if kind is not None else None
        again = next(
            (
                (inc_id, opened)
                for inc_id, inc_kind, inc_evidence, opened in _rows(
                    conn,
                    "SELECT i.id, i.kind, i.evidence, i.opened_ms FROM incidents i, json_each(i.affected_nodes) AS n "
                    "WHERE n.value = ? AND i.opened_ms > ? AND i.opened_ms <= ? AND i.merged_into IS NULL "
                    "AND i.id != ? ORDER BY i.opened_ms",
                    (node, back, back + window_ms, incident_id or ""),
                )
                # the return's own incident gone with the raw history: any recurrence of a fault
                # in the window counts (the cause is unknown, the node failed again all the same)
                if cause is None or cause_of(inc_kind, json.loads(inc_evidence)) == cause
            ),
            None,
        )
        if again is not None and again[1] <= as_of_ms:
            false.append({"node": node, "incident": incident_id, "cause": cause, "back_ms": back,
                          "again_incident": again[0], "again_ms": again[1]})  # fmt: skip
        elif back + window_ms > as_of_ms:
            pending += 1
    return len(returns), false, pending


def annotate_lemons(
    lemons: list[dict[str, Any]], conn: sqlite3.Connection, since_ms: int, until_ms: int, settings: ReportSettings
) -> list[dict[str, Any]]:
    """Each lemon with its false successes of validation in the lemon window: a lemon whose
    validations keep passing is one the ladder's checks do not see (retire it by hand)."""
    if not lemons:
        return lemons
    _, false, _ = validation_figures(conn, since_ms, until_ms, settings.false_success_s, until_ms)
    per_node: dict[str, int] = defaultdict(int)
    for f in false:
        per_node[f["node"]] += 1
    return [{**n, "false_validations": per_node.get(n["node"], 0)} for n in lemons]


def _pool_figures(
    conn: sqlite3.Connection, incidents: list[_Incident], until_ms: int, settings: ReportSettings
) -> tuple[list[float], int, int, list[dict[str, Any]], int, int]:
    """Fault -> node back in the pool, and which evictions were wrongful (docs/reliability.md)."""
    by_id = {i.id: i for i in incidents}
    if not by_id:
        return [], 0, 0, [], 0, 0
    marks = ",".join("?" * len(by_id))
    transitions = _rows(
        conn,
        f"SELECT node, to_state, incident_id, at_ms FROM heal_transitions WHERE incident_id IN ({marks}) "
        "ORDER BY at_ms, id",
        tuple(by_id),
    )
    left: dict[tuple[str, str], int] = {}
    for node, to_state, incident_id, at_ms in transitions:
        if to_state in _OUT_OF_POOL:
            left.setdefault((node, incident_id), at_ms)
    repairs = {
        node: (incident_id, json.loads(evidence))
        for node, incident_id, evidence in _rows(conn, "SELECT node, incident_id, evidence FROM heal_repairs")
    }
    mttr: list[float] = []
    wrongful: list[dict[str, Any]] = []
    still_out = pending = unknown = 0
    clean_ms = int(settings.clean_s * 1000)
    for (node, incident_id), left_ms in sorted(left.items(), key=lambda kv: kv[1]):
        back = conn.execute(
            "SELECT MIN(at_ms) FROM heal_transitions WHERE node = ? AND at_ms >= ? AND to_state IN (?, ?)",
            (node, left_ms, *_BACK_IN_POOL),
        ).fetchone()[0]
        inc = by_id[incident_id]
        if back is None or back > until_ms:
            still_out += 1
            continue
        mttr.append((back - inc.opened_ms) / 1000.0)
        repair = repairs.get(node)
        if repair is None or repair[0] != incident_id:
            unknown += 1  # the node's repair record was overwritten by a later repair
            continue
        found_nothing = all(e.get("ok", False) for e in repair[1] if e.get("step") != "lemon")
        if not found_nothing:
            continue
        if back + clean_ms > until_ms:
            pending += 1
            continue
        again = _rows(
            conn,
            "SELECT 1 FROM incidents, json_each(incidents.affected_nodes) AS n "
            "WHERE n.value = ? AND opened_ms > ? AND opened_ms <= ? AND merged_into IS NULL LIMIT 1",
            (node, back, back + clean_ms),
        )
        if not again:
            wrongful.append({"node": node, "incident": incident_id, "kind": inc.kind, "back_ms": back})
    return mttr, still_out, len(left), wrongful, pending, unknown


def _lemons(conn: sqlite3.Connection, until_ms: int, settings: ReportSettings) -> list[dict[str, Any]]:
    since = until_ms - int(settings.lemon_window_s * 1000)
    return lemon_list(node_fault_counts(conn, since, until_ms), settings)


def node_fault_counts(conn: sqlite3.Connection, since_ms: int, until_ms: int) -> dict[str, int]:
    """Incidents naming each node opened in [since_ms, until_ms) (fabric incidents blame no node)."""
    counts: dict[str, int] = defaultdict(int)
    for (nodes,) in _rows(
        conn,
        "SELECT affected_nodes FROM incidents WHERE merged_into IS NULL AND opened_ms >= ? AND opened_ms < ? "
        "AND kind NOT IN ('switch_fault', 'link_fault', 'partition')",
        (since_ms, until_ms),
    ):
        for node in json.loads(nodes):
            counts[node] += 1
    return counts


def lemon_list(counts: dict[str, int], settings: ReportSettings) -> list[dict[str, Any]]:
    """The nodes at or over the lemon threshold, most faults first."""
    return [
        {"node": n, "faults": c}
        for n, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if c >= settings.lemon_faults
    ]


def _job_figures(
    conn: sqlite3.Connection,
    since_ms: int,
    until_ms: int,
    incidents: list[_Incident],
    intervals: Iterable[Any],
) -> tuple[list[JobFigures], list[float], int]:
    """Per-job ETTR, the fault -> job resumed times, and interruptions no incident explains."""
    gpus_of = {i.node: i.gpus for i in intervals}
    jobs = _rows(
        conn, "SELECT job, declared_nodes, world_size, first_seen_ms, updated_ms, state, ended_ms FROM heal_jobs"
    ) or [(*row, None) for row in _rows(
        conn, "SELECT job, declared_nodes, world_size, first_seen_ms, updated_ms, state FROM heal_jobs"
    )]  # fmt: skip  # a mirror of a database from before jobs could end
    ranks: dict[str, list[tuple[str, float, int]]] = defaultdict(list)
    for job, node, step_time, updated in _rows(conn, "SELECT job, node, step_time_s, updated_ms FROM heal_job_ranks"):
        ranks[job].append((node, float(step_time), int(updated)))
    restarts: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for row in _rows(
        conn,
        "SELECT job, interrupted_ms, reason, interrupted_step, resumed_ms, resumed_from_step, first_step_ms "
        "FROM heal_job_restarts ORDER BY job, interrupted_ms",
    ):
        restarts[row[0]].append(row[1:])
    out: list[JobFigures] = []
    job_mttr: list[float] = []
    software = 0
    for job, declared, world, first_seen, updated, state, ended in jobs:
        job_ranks = ranks.get(job, [])
        nodes = sorted(set(json.loads(declared)) | {n for n, _, _ in job_ranks})
        gpus = int(world) or sum(gpus_of.get(n, 0) for n in nodes)
        last_heard = max([int(updated), *(u for _, _, u in job_ranks)])
        # A job that ended (its own word, the scheduler's, or its ranks all gone) stops there: its
        # figures are final. One whose ranks report ends where they last did; one the scheduler
        # alone declared runs, as far as the controller can tell, to the end of the window.
        if ended is not None:
            end = min(until_ms, max(int(ended), since_ms))
        elif job_ranks and state == "running":
            end = min(until_ms, max(last_heard, since_ms))
        else:
            end = until_ms
        start = max(int(first_seen), since_ms)
        wall_ms = max(0, end - start)
        step_times = [t for _, t, _ in job_ranks if t > 0]
        step_s = statistics.fmean(step_times) if step_times else None
        spans = _restart_spans(restarts.get(job, []), step_s, bool(job_ranks), until_ms)
        down_ms = redo_ms = 0.0
        steps_lost = 0
        interruptions = 0
        scheduler_only = False
        for sp in spans:
            if sp.interrupted_ms >= until_ms or sp.redo_end_ms <= since_ms:
                continue  # wholly after, or over (its redo too) before the window starts
            # Where the time was lost: down from the interruption to the first step after the
            # restart, then the redo right after it; each counted in the window it falls in.
            down_ms += _overlap(sp.interrupted_ms, sp.stop_ms, start, end)
            redo_ms += _overlap(sp.stop_ms, sp.redo_end_ms, start, end)
            scheduler_only |= sp.scheduler_only
            if sp.interrupted_ms < since_ms:
                continue  # counted (interruption, steps, MTTR) in the window it started in
            interruptions += 1
            steps_lost += sp.steps_lost
            if sp.reason == "unrecorded":
                software += 1  # restarted without an incident: the job's own failure (or the scheduler's)
            fault = _fault_of(job, sp.reason, sp.interrupted_ms, incidents)
            if fault is not None and sp.stopped is not None:
                job_mttr.append((sp.stopped - fault.opened_ms) / 1000.0)
        redo_s = redo_ms / 1000.0 if step_s is not None else None
        if wall_ms <= 0:
            basis, ettr, note = "none", None, "no time in the window"
        elif step_s is not None:
            basis, note = "steps", ""
            ettr = max(0.0, (wall_ms - down_ms - redo_ms) / wall_ms)
        elif interruptions or scheduler_only or not job_ranks or down_ms:
            basis = "scheduler"
            note = "no step reports: lost work unknown, ETTR counts downtime only (an upper bound)"
            ettr = max(0.0, 1 - down_ms / wall_ms)
        else:
            basis, ettr, note = "none", None, "no step times and no restarts: ETTR cannot be given"
        down_s = down_ms / 1000.0
        out.append(
            JobFigures(
                job=job,
                gpus=gpus,
                basis=basis,
                wall_s=wall_ms / 1000.0,
                downtime_s=down_s,
                redo_s=redo_s,
                interruptions=interruptions,
                steps_lost=steps_lost,
                ettr=ettr,
                ettr_is_upper_bound=basis == "scheduler",
                mean_time_between_interruptions_s=(wall_ms / 1000.0 / interruptions) if interruptions else None,
                gpu_hours_lost=gpus * (down_s + (redo_s or 0.0)) / 3600.0,
                note=note,
            )
        )
    return out, job_mttr, software


@dataclass(frozen=True)
class _Span:
    """One restart of a job as time: down ``[interrupted_ms, stop_ms)``, redo ``[stop_ms, redo_end_ms)``."""

    reason: str
    interrupted_ms: int
    stopped: int | None  # the first step after the restart (the scheduler's restart without steps); None: still down
    stop_ms: float
    redo_end_ms: float
    steps_lost: int
    scheduler_only: bool


def _restart_spans(rows: list[tuple[Any, ...]], step_s: float | None, has_ranks: bool, until_ms: int) -> list[_Span]:
    """A job's restarts, oldest first, as the time each cost: the downtime, then the redo of the
    steps lost, placed right after the first step of the run (where the job spends it) and cut
    short by the next interruption (whose own lost steps count that redo again)."""
    out: list[_Span] = []
    for i, (interrupted, reason, at_step, resumed, from_step, first_step) in enumerate(rows):
        stopped = first_step if first_step is not None else (resumed if not has_ranks else None)
        lost = max(0, int(at_step) - int(from_step)) if from_step is not None and at_step is not None else 0
        stop_ms = float(until_ms if stopped is None else max(int(stopped), int(interrupted)))
        redo_ms = lost * step_s * 1000.0 if step_s is not None and stopped is not None else 0.0
        nxt = float(rows[i + 1][0]) if i + 1 < len(rows) else float("inf")
        out.append(
            _Span(
                reason=str(reason),
                interrupted_ms=int(interrupted),
                stopped=None if stopped is None else int(stopped),
                stop_ms=stop_ms,
                redo_end_ms=max(stop_ms, min(stop_ms + redo_ms, nxt)),
                steps_lost=lost,
                scheduler_only=first_step is None and resumed is not None and not has_ranks,
            )
        )
    return out


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _fault_of(job: str, reason: str, interrupted_ms: int, incidents: list[_Incident]) -> _Incident | None:
    """The incident that interrupted a job: the healer writes "<kind> on <node>" as the reason."""
    kind, _, node = reason.partition(" on ")
    best = None
    for inc in incidents:
        if inc.opened_ms > interrupted_ms:
            break
        if inc.kind == kind and (node in inc.nodes or job in inc.jobs):
            best = inc
    return best


def headline(report: FleetReport) -> dict[str, float]:
    """The figures the Prometheus series carry (NaN where a figure cannot be given)."""
    nan = float("nan")
    out = {
        "faults": (report.per_1000_gpu_days(report.faults) or 0.0) if report.gpu_days else nan,
        "gpu_seconds": report.gpu_days * 86400.0,
        "mttr_pool_s": statistics.fmean(report.mttr_pool_s) if report.mttr_pool_s else nan,
        "mttr_job_s": statistics.fmean(report.mttr_job_s) if report.mttr_job_s else nan,
        "ettr": nan if report.fleet_ettr is None else report.fleet_ettr,
        "wrongful": float(len(report.wrongful) + report.wrongful_earlier),
        "lemons": float(len(report.lemons)),
        "false_validations": float(len(report.false_validations) + report.false_validations_earlier),
        "false_validation_share": nan if report.false_validation_share is None else report.false_validation_share,
    }
    for cause in CAUSES:
        rate = report.per_1000_gpu_days(report.by_cause.get(cause, 0))
        out[f"faults.{cause}"] = nan if rate is None else rate
    return out
