"""Per-job ETTR and the lemon list beyond the raw horizon (issue 28 items 1 and 4).

Sixty days of a 16-GPU job with three known interruptions: one on day 5 (long before the
horizon), one at 23:00 on day 29 whose downtime runs past midnight into day 30 (it straddles
the 30-day horizon's cutoff) and one on day 45. With a 30-day horizon the sweep aggregates days
0-29 and deletes their raw rows; the 60-day report still gives the exact ETTR, time between
interruptions, steps and GPU-hours lost, from the jobs' daily rows plus the raw rows. A node
whose three faults were all before the horizon stays a lemon for as long as its 28-day rule
holds, and no longer. A database from the previous release (no per-job or per-node tables)
upgrades in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.heal.inservice import FleetServiceLedger
from controller.heal.states import NodeHealState, RemediationStore
from controller.jobs.registry import JobRegistry
from controller.query.fleet import JobFigures, ReportSettings, fleet_report
from controller.query.history import HistoryKeeper, report_with_history
from controller.store import Store
from starpulse.core.clock import FakeClock

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
T0 = 1_700_006_400_000  # a UTC midnight
STEP_S = 2.0
S = NodeHealState

# (interrupted at, down for, steps lost): the job's first step comes `down` after the fault,
# then it redoes the lost steps at STEP_S each
RESTARTS = [
    (5 * DAY_MS + 6 * HOUR_MS, 1 * HOUR_MS, 900),
    (29 * DAY_MS + 23 * HOUR_MS, 2 * HOUR_MS, 600),  # down until day 30, 01:00: across the cutoff
    (45 * DAY_MS, HOUR_MS // 2, 300),
]
WALL_S = 60 * 86400.0
DOWN_S = sum(d for _, d, _ in RESTARTS) / 1000
REDO_S = sum(n for _, _, n in RESTARTS) * STEP_S


def _restart(store: Store, clock: FakeClock, at: int, down: int, lost: int) -> None:
    """One interruption as the registry records it; the ranks' steps written as a resumed run's
    first sample would leave them (as tests/controller/query/test_fleet_report.py does)."""
    jobs = JobRegistry(store.connection, clock)  # read back: the job is running again
    clock.set_ms(T0 + at)
    jobs.mark_interrupted("llm", clock.time_ms(), "gpu_fault on a")
    jobs.mark_resumed("llm", clock.time_ms() + 60_000, 10_000)
    store.connection.execute(
        "UPDATE heal_job_restarts SET interrupted_step = ?, first_step_ms = ?, first_step = 10001 "
        "WHERE job = 'llm' AND interrupted_ms = ?",
        (10_000 + lost, T0 + at + down, T0 + at),
    )
    store.connection.execute("UPDATE heal_jobs SET state = 'running' WHERE job = 'llm'")


@pytest.fixture
def sixty_days(tmp_path: Path) -> tuple[Store, FakeClock]:
    clock = FakeClock(start_ms=T0)
    store = Store(tmp_path / "c.db")
    FleetServiceLedger(store.connection).sync({"a": (8, T0), "b": (8, T0)}, set(), T0)
    JobRegistry(store.connection, clock).register_job("llm", ["a", "b"], world_size=16)
    for at, down, lost in RESTARTS:
        _restart(store, clock, at, down, lost)
    for rank in range(16):  # the ranks as persisted: 2 s a step, heard until now
        store.connection.execute(
            "INSERT INTO heal_job_ranks(job, rank, node, step, step_time_s, last_checkpoint_step, checkpoint_path, "
            "last_checkpoint_ms, pid, world_size, updated_ms) VALUES ('llm', ?, ?, 0, ?, 0, '', 0, 1, 16, ?)",
            (rank, "ab"[rank // 8], STEP_S, T0 + 60 * DAY_MS),
        )
    clock.set_ms(T0 + 60 * DAY_MS)
    return store, clock


def _assert_exact(job: JobFigures) -> None:
    assert (job.basis, job.gpus, job.interruptions, job.steps_lost) == ("steps", 16, 3, 1800)
    assert job.wall_s == pytest.approx(WALL_S)
    assert job.downtime_s == pytest.approx(DOWN_S)
    assert job.redo_s == pytest.approx(REDO_S)
    assert job.ettr == pytest.approx((WALL_S - DOWN_S - REDO_S) / WALL_S)
    assert job.mean_time_between_interruptions_s == pytest.approx(WALL_S / 3)
    assert job.gpu_hours_lost == pytest.approx(16 * (DOWN_S + REDO_S) / 3600)


def test_per_job_ettr_beyond_the_horizon_is_exact(sixty_days: tuple[Store, FakeClock]) -> None:
    store, clock = sixty_days
    now = clock.time_ms()
    (before,) = fleet_report(store.connection, T0, now).jobs
    _assert_exact(before)
    deleted = HistoryKeeper(store.connection, retention_s=30 * 86400.0).sweep(now)
    # the day-5 restart is gone; the one across the cutoff stays a day longer (its redo reaches past it)
    assert deleted["heal_job_restarts"] == 1
    assert store.connection.execute("SELECT COUNT(*) FROM heal_job_restarts").fetchone()[0] == 2
    (raw_only,) = fleet_report(store.connection, T0, now).jobs
    assert raw_only.interruptions == 2  # the raw rows alone have forgotten day 5
    report = report_with_history(store.connection, T0, now)
    (job,) = report.jobs
    _assert_exact(job)
    body = report.to_dict()
    assert body["lost"]["steps"] == 1800
    assert body["lost"]["gpu_hours"] == pytest.approx(16 * (DOWN_S + REDO_S) / 3600)
    assert report.fleet_ettr == pytest.approx(job.ettr)
    # two days later (its redo ended on day 30, plus the day's grace) the straddling restart leaves
    # the raw rows too: still exact
    clock.advance(2 * 86400)
    HistoryKeeper(store.connection, retention_s=30 * 86400.0).sweep(clock.time_ms())
    assert store.connection.execute("SELECT COUNT(*) FROM heal_job_restarts").fetchone()[0] == 1
    (later,) = report_with_history(store.connection, T0, now).jobs
    _assert_exact(later)


def test_each_day_row_holds_that_days_share(sixty_days: tuple[Store, FakeClock]) -> None:
    """Day 29 has the straddling restart's first hour of downtime; day 30 its second hour and the redo."""
    store, clock = sixty_days
    HistoryKeeper(store.connection, retention_s=30 * 86400.0).sweep(clock.time_ms())
    rows = {
        (d - T0) // DAY_MS: (down, redo, n, lost)
        for d, down, redo, n, lost in store.connection.execute(
            "SELECT day_ms, downtime_s, redo_s, interruptions, steps_lost FROM reliability_job_daily WHERE job = 'llm'"
        )
    }
    assert len(rows) == 30  # days 0-29: a row for every day the job ran
    assert rows[5] == (3600.0, 1800.0, 1, 900)
    assert rows[29] == (3600.0, 0.0, 1, 600)
    assert rows[4] == (0.0, 0.0, 0, 0)
    (day30,) = fleet_report(store.connection, T0 + 30 * DAY_MS, T0 + 31 * DAY_MS).jobs
    assert (day30.downtime_s, day30.redo_s, day30.interruptions) == (3600.0, 1200.0, 0)


def _fault(store: Store, clock: FakeClock, node: str, at_ms: int) -> None:
    clock.set_ms(at_ms)
    incidents = IncidentStore(store.connection)
    inc = incidents.open(
        Incident(id="", kind="gpu_fault", root_cause=f"{node}/gpu-0", component_type="gpu", affected_nodes=[node],
                 affected_jobs=[], severity="critical", action="reboot", evidence=[{"rule": "gpu.xid.reboot"}],
                 opened_ms=at_ms)
    )  # fmt: skip
    heal = RemediationStore(store.connection, clock)
    for state in (S.DRAINING, S.EVICTED, S.VALIDATING):
        heal.transition(node, state, "r", inc.id)
    clock.advance(3600)
    heal.transition(node, S.IN_SERVICE, "back", inc.id)
    incidents.resolve(inc, clock.time_ms())


def test_a_lemon_whose_faults_left_the_horizon_stays_one_for_its_28_days(tmp_path: Path) -> None:
    clock = FakeClock(start_ms=T0)
    store = Store(tmp_path / "c.db")
    try:
        FleetServiceLedger(store.connection).sync({"c": (8, T0), "d": (8, T0)}, set(), T0)
        for day in (15, 20, 25):
            _fault(store, clock, "c", T0 + day * DAY_MS)
        _fault(store, clock, "d", T0 + 24 * DAY_MS)
        now = T0 + 40 * DAY_MS
        assert [x["node"] for x in fleet_report(store.connection, now - DAY_MS, now).lemons] == ["c"]
        HistoryKeeper(store.connection, retention_s=10 * 86400.0).sweep(now)  # cutoff: day 30
        assert store.connection.execute("SELECT COUNT(*) FROM incidents").fetchone()[0] == 0
        assert fleet_report(store.connection, now - DAY_MS, now).lemons == []  # the raw rows forgot
        assert report_with_history(store.connection, now - DAY_MS, now).lemons == [
            {"node": "c", "faults": 3, "false_validations": 0}
        ]
        # the window [day 15, day 43) still holds the day-15 fault; [day 16, day 44) does not
        assert report_with_history(store.connection, now, T0 + 43 * DAY_MS).lemons == [
            {"node": "c", "faults": 3, "false_validations": 0}
        ]
        assert report_with_history(store.connection, now, T0 + 44 * DAY_MS).lemons == []
        # the threshold and window are the report's own
        two = ReportSettings(lemon_faults=1)
        assert [x["node"] for x in report_with_history(store.connection, now - DAY_MS, now, two).lemons] == ["c", "d"]
    finally:
        store.close()


def test_a_database_with_only_the_day_figures_upgrades_in_place(sixty_days: tuple[Store, FakeClock]) -> None:
    """Today's release kept reliability_daily alone: the per-job and per-node tables are created on
    start, and the days aggregated from then on have their rows."""
    store, clock = sixty_days
    HistoryKeeper(store.connection, retention_s=40 * 86400.0).sweep(clock.time_ms())  # days 0-19
    store.connection.execute("DROP TABLE reliability_job_daily")
    store.connection.execute("DROP TABLE reliability_node_daily")
    keeper = HistoryKeeper(store.connection, retention_s=30 * 86400.0)  # a restarted controller
    keeper.sweep(clock.time_ms())  # days 20-29
    days = [r[0] for r in store.connection.execute("SELECT DISTINCT day_ms FROM reliability_job_daily ORDER BY 1")]
    assert [(d - T0) // DAY_MS for d in days] == list(range(20, 30))
    (job,) = report_with_history(store.connection, T0 + 20 * DAY_MS, clock.time_ms()).jobs
    assert (job.interruptions, job.steps_lost) == (2, 600 + 300)
