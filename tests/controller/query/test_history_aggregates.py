"""The aggregates are bounded too (issue 28 leftovers, item 2).

Raw rows leave after ``history_retention_s`` (90 days) as before; the daily aggregates they left
behind (``reliability_daily``, ``reliability_job_daily``, ``reliability_node_daily``) now leave after
``aggregate_retention_s`` (2 years), and jobs that ended before the raw horizon leave the job
ledger (``heal_jobs`` and its ranks and restarts), memory included. All on a FakeClock: a fleet
of two nodes and one job that ran for its first 10 days, swept daily over 800 days.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core import DecisionCore
from controller.heal.inservice import FleetServiceLedger
from controller.metrics import ControllerMetrics
from controller.query.history import HistoryKeeper, report_with_history
from controller.settings import ControllerConfig
from controller.store import Store, StoredNode
from starpulse.app.config.controller import load_controller_settings
from starpulse.core.clock import FakeClock
from starpulse.core.schema import ConfigError
from starpulse.v1 import inventory_pb2 as ipb

DAY_MS = 86_400_000
T0 = 1_700_006_400_000  # a UTC midnight


def _days(store: Store, table: str) -> tuple[int | None, int | None]:
    """The first and last day (days since T0) a table holds."""
    lo, hi = store.connection.execute(f"SELECT MIN(day_ms), MAX(day_ms) FROM {table}").fetchone()
    return (None if lo is None else (lo - T0) // DAY_MS, None if hi is None else (hi - T0) // DAY_MS)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "c.db")
    for node in ("a", "b"):
        store.upsert_node(StoredNode(node, ipb.NODE_ROLE_COMPUTE, "online", T0, T0, "", "", ipb.Inventory(), "ep", 0))
    FleetServiceLedger(store.connection).sync({"a": (8, T0), "b": (8, T0)}, set(), T0)
    return store


class TestAggregateRetention:
    def test_daily_aggregates_older_than_their_horizon_are_deleted(self, store: Store) -> None:
        keeper = HistoryKeeper(store.connection, retention_s=90 * 86400.0, aggregate_retention_s=730 * 86400.0)
        keeper.sweep(T0 + 800 * DAY_MS)
        # the raw horizon is day 710: days 0..709 were aggregated, those before day 70 (800 - 730) deleted
        assert _days(store, "reliability_daily") == (70, 709)
        report = report_with_history(store.connection, T0, T0 + 800 * DAY_MS)
        assert report.since_ms == T0 + 70 * DAY_MS  # the report starts at the oldest day kept
        assert report.gpu_days == pytest.approx(16 * 730)

    def test_an_aggregate_horizon_shorter_than_the_raw_one_keeps_the_last_day(self, store: Store) -> None:
        """The last aggregated day marks where aggregation goes on: it stays, or every sweep would
        aggregate again from the fleet's first day."""
        keeper = HistoryKeeper(store.connection, retention_s=90 * 86400.0, aggregate_retention_s=10 * 86400.0)
        keeper.sweep(T0 + 200 * DAY_MS)
        assert _days(store, "reliability_daily") == (109, 109)
        assert keeper.sweep(T0 + 200 * DAY_MS) == {}
        keeper.sweep(T0 + 201 * DAY_MS)
        assert _days(store, "reliability_daily") == (110, 110)

    def test_swept_daily_the_database_holds_a_bounded_number_of_days(self, store: Store, tmp_path: Path) -> None:
        """Daily sweeps over 800 days through the decision core (its hourly sweep, on the FakeClock):
        the aggregates hold 730 - 90 days at the end, not 710."""
        clock = FakeClock(start_ms=T0)
        config = ControllerConfig(db_path=tmp_path / "c.db", history_retention_s=90 * 86400.0)
        core = DecisionCore(config, clock, store, ControllerMetrics())
        for day in range(1, 801):
            clock.set_ms(T0 + day * DAY_MS + 3_600_000)
            core.sweep_history()
        first, last = _days(store, "reliability_daily")
        assert (first, last) == (800 - 730, 800 - 90 - 1)


class TestEndedJobsLeaveTheLedger:
    def test_a_job_ended_before_the_horizon_is_forgotten_after_its_days_are_aggregated(
        self, store: Store, tmp_path: Path
    ) -> None:
        clock = FakeClock(start_ms=T0)
        config = ControllerConfig(db_path=tmp_path / "c.db", history_retention_s=30 * 86400.0)
        core = DecisionCore(config, clock, store, ControllerMetrics())
        core.jobs.register_job("old", ["a", "b"])
        core.jobs.register_job("live", ["a", "b"])
        clock.set_ms(T0 + 10 * DAY_MS)
        core.jobs.register_job("old", [])  # the scheduler removed its nodes: ended on day 10
        clock.set_ms(T0 + 40 * DAY_MS + 1)  # horizon: day 10, the job ended at its start: kept
        core.sweep_history()
        assert core.jobs.job("old") is not None
        clock.set_ms(T0 + 41 * DAY_MS + HOUR_MS)
        core.sweep_history()
        assert core.jobs.job("old") is None and core.jobs.job("live") is not None
        assert store.connection.execute("SELECT job FROM heal_jobs").fetchall() == [("live",)]
        # its ten days live on in the per-job aggregates, its wall time final
        old = next(j for j in report_with_history(store.connection, T0, clock.time_ms()).jobs if j.job == "old")
        assert old.wall_s == pytest.approx(10 * 86400.0)
        again = DecisionCore(config, clock, store, ControllerMetrics())
        assert again.jobs.job("old") is None


HOUR_MS = 3_600_000


class TestSetting:
    def test_the_aggregate_horizon_must_outlast_the_raw_one(self, tmp_path: Path) -> None:
        path = tmp_path / "controller.yaml"
        path.write_text("server:\n  history_retention_s: 7776000\n  aggregate_retention_s: 86400\n")
        with pytest.raises(ConfigError) as err:
            load_controller_settings(path, env={})
        assert "server.aggregate_retention_s" in str(err.value)

    def test_the_defaults_are_90_days_raw_and_2_years_aggregated(self) -> None:
        config = ControllerConfig()
        assert (config.history_retention_s, config.aggregate_retention_s) == (90 * 86400.0, 730 * 86400.0)
