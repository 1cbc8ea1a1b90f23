"""``/api/fleet``: the fleet report and its figures per day, for the dashboard's plots.

Per day of a known history (tests/controller/query/test_fleet_report.py's ten days): the
fault rate by cause over that day's GPU-days, MTTR where a node came back that day, and null
(never 0) where there is no figure.
"""

from __future__ import annotations

import pytest

from controller.outputs.web.fleet import fleet_json
from controller.query.store import StoreQueries
from controller.service import Controller
from tests.controller.query.test_fleet_report import History, history
from tests.support import web as shared
from tests.support.web import Client, get_json

fabric = shared.fabric
ctl = shared.ctl
client = shared.client
__all__ = ["history"]  # the known history, a fixture


def test_each_day_has_its_own_rate_by_cause_mttr_and_ettr(history: History) -> None:
    store, clock = history
    queries = StoreQueries(store, clock)
    body = fleet_json(queries, days=10, buckets=10)
    assert body["report"] == queries.fleet_report(10 * 86400.0).to_dict()  # what `starpulse report` gives
    series = body["series"]
    assert len(series) == 10 and series[0]["from_ms"] < series[-1]["from_ms"]
    day1, day2, day3 = series[1], series[2], series[3]
    # day 1: four 8-GPU nodes in service (32 GPU-days), one GPU fault; node-0 back after 1 h
    assert day1["gpu_days"] == pytest.approx(32.0)
    assert day1["by_cause"]["gpu"] == pytest.approx(1000 / 32)
    assert day1["by_cause"]["hbm_ecc"] is not None and day1["by_cause"]["hbm_ecc"] == 0
    assert day1["mttr_pool_h"] == pytest.approx(1.0)
    assert day2["by_cause"]["hbm_ecc"] == pytest.approx(1000 / 32) and day2["mttr_pool_h"] == pytest.approx(3.0)
    assert day3["by_cause"]["nic"] == pytest.approx(1000 / 32)
    assert day3["mttr_pool_h"] is None and day3["mttr_job_h"] is None  # nobody came back that day: no figure
    # each job's ETTR per day is the fleet report's own figure for that day
    spans = queries.fleet_series(10 * 86400.0, 10)
    assert [b["ettr"] for b in series] == [{j.job: j.ettr for j in r.jobs} for r in spans]
    assert all("llm" in b["ettr"] for b in series)


async def test_the_route_answers_and_names_a_bad_parameter(ctl: Controller, client: Client) -> None:
    body = await get_json(client, "/api/fleet?days=3&buckets=3")
    assert body["days"] == 3 and len(body["series"]) == 3 and "gpu" in body["causes"]
    assert body["report"]["faults"]["total"] == 0
    bad = await get_json(client, "/api/fleet?days=0", status=400)
    assert "days" in str(bad)
