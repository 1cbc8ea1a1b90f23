"""``GET /api/fleet``: the fleet report and its figures over time, for the dashboard's plots.

The same figures as ``starpulse report`` (controller.query.fleet, docs/reliability.md): the
whole window's report, and per span of it the fault rate by cause (per 1,000 GPU-days), the
mean MTTR (fault to node back in the pool, fault to job resumed) and each job's ETTR. A span
with no GPU-days or no repair has ``null`` there, never 0.
"""

from __future__ import annotations

import statistics
from typing import Any

from controller.query.fleet import CAUSES, FleetReport
from controller.query.surface import Queries

DAY_S = 86400.0
MAX_DAYS = 365
MAX_BUCKETS = 120


def _mean_h(values: list[float]) -> float | None:
    return statistics.fmean(values) / 3600.0 if values else None


def bucket_json(report: FleetReport) -> dict[str, Any]:
    """One span's figures: what each plot draws for it."""
    return {
        "from_ms": report.since_ms,
        "to_ms": report.until_ms,
        "gpu_days": report.gpu_days,
        "faults": report.faults,
        "by_cause": {c: report.per_1000_gpu_days(report.by_cause.get(c, 0)) for c in CAUSES},
        "mttr_pool_h": _mean_h(report.mttr_pool_s),
        "mttr_job_h": _mean_h(report.mttr_job_s),
        "ettr": {j.job: j.ettr for j in report.jobs},
    }


def fleet_json(queries: Queries | None, days: float, buckets: int) -> dict[str, Any]:
    """The report over the last ``days`` and its ``buckets`` spans (oldest first)."""
    if queries is None:
        return {"days": days, "report": None, "series": []}
    window_s = days * DAY_S
    return {
        "days": days,
        "causes": list(CAUSES),
        "report": queries.fleet_report(window_s).to_dict(),
        "series": [bucket_json(r) for r in queries.fleet_series(window_s, buckets)],
    }
