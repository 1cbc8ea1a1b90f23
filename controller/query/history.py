"""Bounded history (issue 28 item 4): raw rows kept for a horizon, daily aggregates beyond it.

Events, resolved incidents and their history, remediation transitions and finished actions,
guard grants, GPU fault counts, finished job restarts and closed in-service intervals older
than the horizon are deleted (the HA mirror's triggers
carry the deletes to etcd). Before a day leaves the horizon, the figures the fleet report
needs are written to ``reliability_daily`` (one row per day and figure: faults per cause,
node- and GPU-milliseconds in service, the MTTR sums and counts, evictions, wrongful ones),
so a report over a longer window adds those days to what the raw rows give. The database
stays bounded whatever the fleet's age: the raw rows of the horizon, plus a few dozen rows a day.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

import structlog

from controller.query.fleet import CAUSES, DAY_MS, FleetReport, ReportSettings, fleet_report
from controller.store import transaction

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reliability_daily (
    day_ms INTEGER NOT NULL,
    figure TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (day_ms, figure)
);
"""

# (table, the time column, an extra condition: rows still in use are never deleted)
_EXPIRING = (
    ("events", "received_ms", ""),
    ("incident_history", "ts_ms", " AND incident_id IN (SELECT id FROM incidents WHERE resolved_ms IS NOT NULL)"),
    ("incidents", "resolved_ms", " AND resolved_ms IS NOT NULL"),
    ("heal_transitions", "at_ms", ""),
    ("heal_job_restarts", "interrupted_ms", " AND first_step_ms IS NOT NULL"),
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
    }
    for cause in CAUSES:
        if report.by_cause.get(cause):
            out[f"faults.{cause}"] = float(report.by_cause[cause])
    return out


class HistoryKeeper:
    """Aggregates days leaving the horizon, then deletes what is older (``sweep``, every hour or so)."""

    def __init__(self, conn: sqlite3.Connection, retention_s: float) -> None:
        self._db = conn
        self.retention_ms = int(retention_s * 1000)
        self._db.executescript(_SCHEMA)

    def sweep(self, now_ms: int) -> dict[str, int]:
        """Aggregate every whole day before the cutoff not yet aggregated, then delete older raw rows.

        Returns rows deleted per table. The cutoff is a day boundary (UTC), so a day is either
        wholly in the aggregates or wholly in the raw rows.
        """
        cutoff = (now_ms - self.retention_ms) // DAY_MS * DAY_MS
        aggregated = self._aggregate_until(cutoff)
        deleted: dict[str, int] = {}
        with transaction(self._db):
            for table, column, extra in _EXPIRING:
                try:
                    cur = self._db.execute(f'DELETE FROM "{table}" WHERE {column} < ?{extra}', (cutoff,))
                except sqlite3.OperationalError:  # a controller without that module's table
                    continue
                if cur.rowcount:
                    deleted[table] = cur.rowcount
        if deleted or aggregated:
            log.info("history_swept", cutoff_ms=cutoff, days_aggregated=aggregated, deleted=deleted)
        return deleted

    def _aggregate_until(self, cutoff: int) -> int:
        last = self._db.execute("SELECT MAX(day_ms) FROM reliability_daily").fetchone()[0]
        first = self._first_day() if last is None else last + DAY_MS
        if first is None:
            return 0
        days = 0
        day = first
        while day + DAY_MS <= cutoff:
            figures = day_figures(fleet_report(self._db, day, day + DAY_MS, ReportSettings()))
            figures["aggregated"] = 1.0  # marks the day done even when nothing happened
            with transaction(self._db):
                self._db.executemany(
                    "INSERT OR REPLACE INTO reliability_daily(day_ms, figure, value) VALUES (?, ?, ?)",
                    [(day, k, v) for k, v in figures.items()],
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
        jobs=report.jobs,  # ETTR per job: from the raw horizon only
        evictions=report.evictions + int(sums.get("evictions", 0.0)),
        wrongful=report.wrongful,
        wrongful_pending=report.wrongful_pending,
        wrongful_unknown=report.wrongful_unknown,
        lemons=report.lemons,
        settings=report.settings,
        wrongful_earlier=report.wrongful_earlier + int(sums.get("wrongful", 0.0)),
    )


def report_with_history(
    conn: sqlite3.Connection, since_ms: int, until_ms: int, settings: ReportSettings | None = None
) -> FleetReport:
    """The fleet report over [since_ms, until_ms): aggregated days where the raw rows are gone,
    raw rows after them. The window starts no earlier than the oldest day kept."""
    sums, first, end = daily_sums(conn, since_ms, until_ms)
    if not sums:
        return fleet_report(conn, since_ms, until_ms, settings)
    return merge_daily(fleet_report(conn, end, until_ms, settings), sums, first)


def _spread(total: float, n: float) -> list[float]:
    """An aggregated mean as n equal values: the report's mean stays exact (its median does not)."""
    count = int(n)
    return [total / count] * count if count else []
