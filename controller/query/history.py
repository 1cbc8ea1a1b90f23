"""Bounded history (issue 28 item 4): raw rows kept for a horizon, daily aggregates beyond it.

Events, resolved incidents and their history, remediation transitions and finished actions,
guard grants, GPU fault counts, finished job restarts and closed in-service intervals older
than the horizon are deleted (the HA mirror's triggers
carry the deletes to etcd). Before a day leaves the horizon, the figures the fleet report
needs are written to ``reliability_daily`` (one row per day and figure: faults per cause,
node- and GPU-milliseconds in service, the MTTR sums and counts, evictions, wrongful ones),
``reliability_job_daily`` (per job and day: its wall time, downtime, redo, interruptions and
steps lost in that day, from which its ETTR over any run of days is exact) and
``reliability_node_daily`` (per node and day: the incidents naming it, for the lemon rule),
so a report over a longer window adds those days to what the raw rows give. The database
stays bounded by the horizon: its raw rows, plus a few dozen rows a day and one per job and
per faulty node a day.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

import structlog

from controller.query.fleet import (
    CAUSES,
    DAY_MS,
    FleetReport,
    JobFigures,
    ReportSettings,
    annotate_lemons,
    fleet_report,
    lemon_list,
    node_fault_counts,
)
from controller.store import transaction

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reliability_daily (
    day_ms INTEGER NOT NULL,
    figure TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (day_ms, figure)
);
CREATE TABLE IF NOT EXISTS reliability_job_daily (
    day_ms INTEGER NOT NULL,
    job TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    basis TEXT NOT NULL,
    wall_s REAL NOT NULL,
    downtime_s REAL NOT NULL,
    redo_s REAL,
    interruptions INTEGER NOT NULL,
    steps_lost INTEGER NOT NULL,
    PRIMARY KEY (day_ms, job)
);
CREATE TABLE IF NOT EXISTS reliability_node_daily (
    day_ms INTEGER NOT NULL,
    node TEXT NOT NULL,
    faults INTEGER NOT NULL,
    PRIMARY KEY (day_ms, node)
);
"""

AGGREGATE_RETENTION_S = 730 * 86400.0  # ControllerConfig.aggregate_retention_s's default: two years
_AGGREGATES = ("reliability_daily", "reliability_job_daily", "reliability_node_daily")

# (table, the time column, an extra condition: rows still in use are never deleted)
_EXPIRING = (
    ("events", "received_ms", ""),
    ("incident_history", "ts_ms", " AND incident_id IN (SELECT id FROM incidents WHERE resolved_ms IS NOT NULL)"),
    ("incidents", "resolved_ms", " AND resolved_ms IS NOT NULL"),
    ("heal_transitions", "at_ms", ""),
    # a restart leaves once it ended (its first step, or the scheduler's restart for a job without
    # steps) a day before the cutoff: the raw rows still place its downtime and redo in the days
    # after the cutoff that it reached into (the redo follows the first step)
    ("heal_job_restarts", f"COALESCE(first_step_ms, resumed_ms) + {DAY_MS}", ""),
    ("fleet_service", "to_ms", " AND to_ms IS NOT NULL"),
    ("heal_pending_actions", "updated_ms", " AND status != 'planned'"),  # a planned one is still to do
    ("heal_grants", "at_ms", ""),  # the budget's and cool-down's windows are minutes to hours
    ("heal_gpu_faults", "at_ms", ""),  # the escalation window is a day
)


def day_figures(report: FleetReport) -> dict[str, float]:
    """One day's report as the rows ``reliability_daily`` keeps."""
    out = {
        "node_ms": report.node_days * DAY_MS,
        "gpu_ms": report.gpu_days * DAY_MS,
        "mttr_pool_sum_s": sum(report.mttr_pool_s),
        "mttr_pool_n": float(len(report.mttr_pool_s)),
        "mttr_job_sum_s": sum(report.mttr_job_s),
        "mttr_job_n": float(len(report.mttr_job_s)),
        "evictions": float(report.evictions),
        "wrongful": float(len(report.wrongful)),
        "validated_returns": float(report.validated_returns),
        "false_validations": float(len(report.false_validations)),
    }
    for cause in CAUSES:
        if report.by_cause.get(cause):
            out[f"faults.{cause}"] = float(report.by_cause[cause])
    return out


class HistoryKeeper:
    """Aggregates days leaving the horizon, then deletes what is older (``sweep``, every hour or so)."""

    def __init__(
        self, conn: sqlite3.Connection, retention_s: float, aggregate_retention_s: float = AGGREGATE_RETENTION_S
    ) -> None:
        self._db = conn
        self.retention_ms = int(retention_s * 1000)
        self.aggregate_retention_ms = int(aggregate_retention_s * 1000)
        self._db.executescript(_SCHEMA)

    def cutoff(self, now_ms: int) -> int:
        """The raw history's horizon at ``now_ms``: a UTC day boundary; older raw rows are deleted."""
        return (now_ms - self.retention_ms) // DAY_MS * DAY_MS

    def sweep(self, now_ms: int) -> dict[str, int]:
        """Aggregate every whole day before the cutoff not yet aggregated, then delete older raw rows,
        and the daily aggregates older than their own (longer) horizon.

        Returns rows deleted per table. The cutoff is a day boundary (UTC), so a day is either
        wholly in the aggregates or wholly in the raw rows.
        """
        cutoff = self.cutoff(now_ms)
        aggregated = self._aggregate_until(cutoff, now_ms)
        deleted: dict[str, int] = {}
        with transaction(self._db):
            for table, column, extra in _EXPIRING:
                try:
                    cur = self._db.execute(f'DELETE FROM "{table}" WHERE {column} < ?{extra}', (cutoff,))
                except sqlite3.OperationalError:  # a controller without that module's table
                    continue
                if cur.rowcount:
                    deleted[table] = cur.rowcount
            deleted.update(self._expire_aggregates(now_ms))
        if deleted or aggregated:
            log.info("history_swept", cutoff_ms=cutoff, days_aggregated=aggregated, deleted=deleted)
        return deleted

    def _expire_aggregates(self, now_ms: int) -> dict[str, int]:
        """Delete the daily aggregates older than their horizon. The last aggregated day always
        stays: it marks where aggregation goes on (a horizon no longer than the raw one would
        otherwise make the next sweep aggregate again from the fleet's first day)."""
        last = self._db.execute("SELECT MAX(day_ms) FROM reliability_daily").fetchone()[0]
        if last is None:
            return {}
        before = min((now_ms - self.aggregate_retention_ms) // DAY_MS * DAY_MS, int(last))
        deleted = {}
        for table in _AGGREGATES:
            cur = self._db.execute(f'DELETE FROM "{table}" WHERE day_ms < ?', (before,))
            if cur.rowcount:
                deleted[table] = cur.rowcount
        return deleted

    def _aggregate_until(self, cutoff: int, now_ms: int) -> int:
        last = self._db.execute("SELECT MAX(day_ms) FROM reliability_daily").fetchone()[0]
        first = self._first_day() if last is None else last + DAY_MS
        if first is None:
            return 0
        days = 0
        day = first
        while day + DAY_MS <= cutoff:
            # judged with what is known now: a return late in the day has had its false-success window
            report = fleet_report(self._db, day, day + DAY_MS, ReportSettings(), as_of_ms=now_ms)
            figures = day_figures(report)
            figures["aggregated"] = 1.0  # marks the day done even when nothing happened
            with transaction(self._db):
                self._db.executemany(
                    "INSERT OR REPLACE INTO reliability_daily(day_ms, figure, value) VALUES (?, ?, ?)",
                    [(day, k, v) for k, v in figures.items()],
                )
                self._db.executemany(
                    "INSERT OR REPLACE INTO reliability_job_daily(day_ms, job, gpus, basis, wall_s, downtime_s, "
                    "redo_s, interruptions, steps_lost) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(day, j.job, j.gpus, j.basis, j.wall_s, j.downtime_s, j.redo_s, j.interruptions, j.steps_lost)
                     for j in report.jobs if j.wall_s > 0 or j.interruptions or j.downtime_s],
                )  # fmt: skip
                self._db.executemany(
                    "INSERT OR REPLACE INTO reliability_node_daily(day_ms, node, faults) VALUES (?, ?, ?)",
                    [(day, n, c) for n, c in node_fault_counts(self._db, day, day + DAY_MS).items()],
                )
            day += DAY_MS
            days += 1
        return days

    def _first_day(self) -> int | None:
        starts = []
        for sql in (
            "SELECT MIN(from_ms) FROM fleet_service",
            "SELECT MIN(opened_ms) FROM incidents",
        ):
            try:
                value = self._db.execute(sql).fetchone()[0]
            except sqlite3.OperationalError:
                continue
            if value is not None:
                starts.append(int(value))
        return min(starts) // DAY_MS * DAY_MS if starts else None


def daily_sums(conn: sqlite3.Connection, since_ms: int, until_ms: int) -> tuple[dict[str, float], int, int]:
    """The aggregates of the whole days inside [since_ms, until_ms): (sums by figure, first, end).

    ``first``..``end`` is the span they cover (end == first: none); the caller takes raw rows
    for the rest of its window.
    """
    try:
        rows = conn.execute(
            "SELECT day_ms, figure, value FROM reliability_daily WHERE day_ms >= ? AND day_ms + ? <= ?",
            (since_ms, DAY_MS, until_ms),
        ).fetchall()
    except sqlite3.OperationalError:
        return {}, since_ms, since_ms
    if not rows:
        return {}, since_ms, since_ms
    sums: dict[str, float] = {}
    for _, figure, value in rows:
        sums[figure] = sums.get(figure, 0.0) + value
    days = sorted({d for d, _, _ in rows})
    return sums, days[0], days[-1] + DAY_MS


def merge_daily(report: FleetReport, sums: Mapping[str, float], first_ms: int) -> FleetReport:
    """``report`` (raw rows, from the horizon on) with the aggregated days before it added."""
    if not sums:
        return report
    by_cause = dict(report.by_cause)
    for key, value in sums.items():
        if key.startswith("faults."):
            cause = key.split(".", 1)[1]
            by_cause[cause] = by_cause.get(cause, 0) + int(value)
    extra_faults = sum(int(v) for k, v in sums.items() if k.startswith("faults."))
    faults = report.faults + extra_faults
    node_ms = report.node_days * DAY_MS + sums.get("node_ms", 0.0)
    window_h = (report.until_ms - first_ms) / 3_600_000
    pool = _spread(sums.get("mttr_pool_sum_s", 0.0), sums.get("mttr_pool_n", 0.0))
    job = _spread(sums.get("mttr_job_sum_s", 0.0), sums.get("mttr_job_n", 0.0))
    return FleetReport(
        since_ms=first_ms,
        until_ms=report.until_ms,
        node_days=node_ms / DAY_MS,
        gpu_days=report.gpu_days + sums.get("gpu_ms", 0.0) / DAY_MS,
        nodes_in_service=report.nodes_in_service,
        gpus_in_service=report.gpus_in_service,
        faults=faults,
        by_cause=by_cause,
        mtbf_fleet_h=window_h / faults if faults else None,
        mtbf_node_h=node_ms / 3_600_000 / faults if faults else None,
        mttr_pool_s=report.mttr_pool_s + pool,
        still_out=report.still_out,
        mttr_job_s=report.mttr_job_s + job,
        jobs=report.jobs,  # the raw rows' jobs: report_with_history adds their aggregated days
        evictions=report.evictions + int(sums.get("evictions", 0.0)),
        wrongful=report.wrongful,
        wrongful_pending=report.wrongful_pending,
        wrongful_unknown=report.wrongful_unknown,
        lemons=report.lemons,
        settings=report.settings,
        wrongful_earlier=report.wrongful_earlier + int(sums.get("wrongful", 0.0)),
        validated_returns=report.validated_returns,
        false_validations=report.false_validations,
        false_validation_pending=report.false_validation_pending,
        validated_earlier=report.validated_earlier + int(sums.get("validated_returns", 0.0)),
        false_validations_earlier=report.false_validations_earlier + int(sums.get("false_validations", 0.0)),
    )


def report_with_history(
    conn: sqlite3.Connection, since_ms: int, until_ms: int, settings: ReportSettings | None = None
) -> FleetReport:
    """The fleet report over [since_ms, until_ms): aggregated days where the raw rows are gone,
    raw rows after them. The window starts no earlier than the oldest day kept. Per-job figures
    add the jobs' daily rows; the lemon list counts the nodes' daily rows for the part of its
    window before the raw rows."""
    settings = settings or ReportSettings()
    sums, first, end = daily_sums(conn, since_ms, until_ms)
    if not sums:
        report = fleet_report(conn, since_ms, until_ms, settings)
    else:
        raw = fleet_report(conn, end, until_ms, settings)
        report = merge_daily(raw, sums, first)
        report.jobs = merge_jobs(raw.jobs, job_days(conn, first, end))
    since = until_ms - int(settings.lemon_window_s * 1000)
    report.lemons = annotate_lemons(lemons_with_history(conn, until_ms, settings), conn, since, until_ms, settings)
    return report


def aggregated_until(conn: sqlite3.Connection) -> int | None:
    """The end of the last day in the aggregates (raw rows before it may be gone); None: none yet."""
    try:
        last = conn.execute("SELECT MAX(day_ms) FROM reliability_daily").fetchone()[0]
    except sqlite3.OperationalError:
        return None
    return None if last is None else int(last) + DAY_MS


def job_days(conn: sqlite3.Connection, first_ms: int, end_ms: int) -> list[JobFigures]:
    """Each job's aggregated days in [first_ms, end_ms), summed into one JobFigures per job
    (basis: its latest day's)."""
    try:
        rows = conn.execute(
            "SELECT job, gpus, basis, wall_s, downtime_s, redo_s, interruptions, steps_lost "
            "FROM reliability_job_daily WHERE day_ms >= ? AND day_ms < ? ORDER BY day_ms",
            (first_ms, end_ms),
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    out: dict[str, JobFigures] = {}
    for job, gpus, basis, wall, down, redo, interruptions, lost in rows:
        day = _figures(job, int(gpus), str(basis), float(wall), float(down), redo, int(interruptions), int(lost))
        out[job] = day if job not in out else _add(out[job], day)
    return list(out.values())


def merge_jobs(raw: list[JobFigures], days: list[JobFigures]) -> list[JobFigures]:
    """The raw window's job figures with each job's aggregated days added (the jobs of either)."""
    merged = {j.job: j for j in days}
    for j in raw:
        merged[j.job] = _add(merged[j.job], j) if j.job in merged else j
    return [merged[k] for k in sorted(merged)]


def _add(a: JobFigures, b: JobFigures) -> JobFigures:
    """Two spans of one job as one: sums, the later span's basis (a job that reported steps once
    does again: ``steps`` wins over ``scheduler`` over ``none``), ETTR recomputed."""
    order = ("none", "scheduler", "steps")
    basis = max(a.basis, b.basis, key=order.index)
    redo = None if a.redo_s is None and b.redo_s is None else (a.redo_s or 0.0) + (b.redo_s or 0.0)
    gpus = max(a.gpus, b.gpus)
    return _figures(a.job, gpus, basis, a.wall_s + b.wall_s, a.downtime_s + b.downtime_s, redo,
                    a.interruptions + b.interruptions, a.steps_lost + b.steps_lost,
                    a.gpu_hours_lost + b.gpu_hours_lost)  # fmt: skip


def _figures(
    job: str,
    gpus: int,
    basis: str,
    wall_s: float,
    down_s: float,
    redo_s: float | None,
    interruptions: int,
    steps_lost: int,
    gpu_hours_lost: float | None = None,
) -> JobFigures:
    """A job's figures from its sums, with ETTR by docs/reliability.md's definition."""
    if wall_s <= 0 or basis == "none":
        ettr, note = None, "no time in the window" if wall_s <= 0 else "no step times and no restarts"
        basis = "none"
    elif basis == "steps":
        ettr, note = max(0.0, (wall_s - down_s - (redo_s or 0.0)) / wall_s), ""
    else:
        ettr = max(0.0, 1 - down_s / wall_s)
        note = "no step reports: lost work unknown, ETTR counts downtime only (an upper bound)"
    lost_h = gpus * (down_s + (redo_s or 0.0)) / 3600.0 if gpu_hours_lost is None else gpu_hours_lost
    return JobFigures(
        job=job,
        gpus=gpus,
        basis=basis,
        wall_s=wall_s,
        downtime_s=down_s,
        redo_s=redo_s,
        interruptions=interruptions,
        steps_lost=steps_lost,
        ettr=ettr,
        ettr_is_upper_bound=basis == "scheduler",
        mean_time_between_interruptions_s=wall_s / interruptions if interruptions else None,
        gpu_hours_lost=lost_h,
        note=note,
    )


def lemons_with_history(conn: sqlite3.Connection, until_ms: int, settings: ReportSettings) -> list[dict[str, Any]]:
    """The lemon list at ``until_ms``: raw incidents from where the aggregates end, the nodes'
    daily rows before it. An aggregated day counts when any of it is inside the lemon window
    (the window is rounded out to whole days there: a lemon is never missed for the rounding)."""
    since = until_ms - int(settings.lemon_window_s * 1000)
    agg_end = aggregated_until(conn)
    if agg_end is None or agg_end <= since:
        return lemon_list(node_fault_counts(conn, since, until_ms), settings)
    counts = dict(node_fault_counts(conn, agg_end, until_ms)) if agg_end < until_ms else {}
    try:
        rows = conn.execute(
            "SELECT node, SUM(faults) FROM reliability_node_daily WHERE day_ms + ? > ? AND day_ms < ? GROUP BY node",
            (DAY_MS, since, min(agg_end, until_ms)),
        ).fetchall()
    except sqlite3.OperationalError:
        rows = []
    for node, faults in rows:
        counts[node] = counts.get(node, 0) + int(faults)
    return lemon_list(counts, settings)


def _spread(total: float, n: float) -> list[float]:
    """An aggregated mean as n equal values: the report's mean stays exact (its median does not)."""
    count = int(n)
    return [total / count] * count if count else []
