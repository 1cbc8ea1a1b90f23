"""A job's end reaches the fleet ledger through the controller's own inputs (issue 28, leftovers item 1).

Before, nothing told the ledger a job was over: a job whose ranks exited (their rows deleted)
or that its scheduler finished kept accruing wall time to the report's window end, so its ETTR
crept towards 1 and its time between interruptions grew for ever. Each test drives a
``DecisionCore`` on a ``FakeClock`` (real reports with the ranks' ``JobStepSample``, the
``job_progress`` entry, the scheduler's declaration) and reads the figures back from the query
surface the outputs read (``StoreQueries.fleet_report``, SQLite), a day after the job ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.core import DecisionCore
from controller.jobs.registry import ENDED, RESUMING, RUNNING
from controller.metrics import ControllerMetrics
from controller.query.fleet import JobFigures
from controller.query.store import StoreQueries
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NODES = ("node-001", "node-002")
HOUR_S = 3600.0
STEP_S = 2.0


@pytest.fixture
def core(tmp_path: Path) -> Iterator[DecisionCore]:
    clock = FakeClock()
    clock.set_ms(1_700_006_400_000)
    config = ControllerConfig(db_path=tmp_path / "c.db", heartbeat_timeout_s=10 * 86400.0)
    store = Store(config.db_path)
    try:
        core = DecisionCore(config, clock, store, ControllerMetrics())
        for node in NODES:
            inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)])
            core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b1"))
        yield core
    finally:
        store.close()


def _clock(core: DecisionCore) -> FakeClock:
    assert isinstance(core.clock, FakeClock)
    return core.clock


def _report(core: DecisionCore, job: str, step: int, pid: int = 100, ranks: bool = True, resumed: int = 0) -> None:
    """Every node's report; with ``ranks`` each carries its rank of ``job`` at ``step``."""
    now = core.clock.time_ms()
    for rank, node in enumerate(NODES):
        steps = []
        if ranks:
            steps = [tpb.JobStepSample(job=job, rank=rank, step=step, step_time_s=STEP_S, pid=pid + rank,
                                       world_size=len(NODES), phase="training", resumed_from_step=resumed)]  # fmt: skip
        core.report(node, tpb.Report(seq=step + 1, timestamp_ms=now, job_steps=steps))


def _job(core: DecisionCore, job: str, days: float = 1.0) -> JobFigures:
    report = StoreQueries(core.store, core.clock).fleet_report(days * 86400.0)
    return next(j for j in report.jobs if j.job == job)


def _run(core: DecisionCore, job: str, hours: float, from_step: int = 1, pid: int = 100) -> int:
    """The job's ranks report a step every STEP_S*300 (10 min) for ``hours``; returns the last step."""
    step = from_step
    for _ in range(int(hours * 6)):
        _report(core, job, step, pid)
        _clock(core).advance(600.0)
        step += 300
    _report(core, job, step, pid)
    return step


class TestJobEnd:
    def test_a_job_that_says_it_completed_stops_accruing_wall_time(self, core: DecisionCore) -> None:
        """job_progress with a final phase ends the job: its wall time stops there, a day later too."""
        _run(core, "llm", hours=4.0)
        core.job_progress("llm", 2400, at_ms=core.clock.time_ms(), phase="completed")
        rec = core.jobs.job("llm")
        assert rec is not None and (rec.state, rec.end_reason, rec.ended_ms) == (
            ENDED,
            "completed",
            core.clock.time_ms(),
        )
        _clock(core).advance(20 * HOUR_S)
        _report(core, "llm", 2401)  # a rank's last sample after its word: not a new run
        figures = _job(core, "llm")
        assert figures.wall_s == pytest.approx(4 * HOUR_S)
        assert (figures.basis, figures.ettr, figures.interruptions) == ("steps", 1.0, 0)
        assert core.jobs.jobs_of(NODES[0]) == []  # nothing left on its nodes for the healer to requeue
        assert core.jobs.first_job_by_node() == {}  # nor for the fail-slow peer map

    def test_an_interrupted_job_cancelled_while_down_counts_its_downtime_only_until_the_end(
        self, core: DecisionCore
    ) -> None:
        """Down 1 h, then cancelled: wall 3 h (2 up, 1 down), ETTR 2/3 for good, not 1 - 1/25 a day later."""
        _run(core, "llm", hours=2.0)
        core.jobs.mark_interrupted("llm", core.clock.time_ms(), "gpu_fault on node-001")
        _report(core, "llm", 0, ranks=False)  # the ranks are gone from the nodes
        _clock(core).advance(HOUR_S)
        core.job_progress("llm", 1200, at_ms=core.clock.time_ms(), phase="cancelled")
        _clock(core).advance(21 * HOUR_S)
        figures = _job(core, "llm")
        assert figures.wall_s == pytest.approx(3 * HOUR_S)
        assert figures.downtime_s == pytest.approx(HOUR_S)
        assert figures.ettr == pytest.approx(2 / 3)
        assert figures.interruptions == 1

    def test_the_schedulers_job_whose_nodes_are_removed_ends_there(self, core: DecisionCore) -> None:
        """A job the scheduler alone declares (no ranks) ends when its declaration lists no node."""
        core.jobs.register_job("batch", NODES)
        _clock(core).advance(5 * HOUR_S)
        core.jobs.register_job("batch", [])
        _clock(core).advance(10 * HOUR_S)
        rec = core.jobs.job("batch")
        assert rec is not None and (rec.state, rec.end_reason) == (ENDED, "nodes_removed")
        assert _job(core, "batch").wall_s == pytest.approx(5 * HOUR_S)

    def test_a_job_whose_ranks_all_left_ends_where_they_left(self, core: DecisionCore) -> None:
        """Before, the deleted ranks made it a scheduler-only job running to the window's end."""
        _run(core, "llm", hours=3.0)
        _report(core, "llm", 0, ranks=False)
        ended = core.clock.time_ms()
        _clock(core).advance(12 * HOUR_S)
        rec = core.jobs.job("llm")
        assert rec is not None and (rec.state, rec.end_reason, rec.ended_ms) == (ENDED, "ranks_left", ended)
        figures = _job(core, "llm")
        assert figures.wall_s == pytest.approx(3 * HOUR_S)
        assert figures.basis == "steps"  # its ranks' step times are kept with the ended job

    def test_the_jobs_word_after_its_ranks_left_keeps_the_time_they_left(self, core: DecisionCore) -> None:
        """Ranks gone first, the launcher's "completed" a minute later: the end stays where the ranks
        left, its reason becomes the job's own, and a late rank sample no longer reopens it."""
        step = _run(core, "llm", hours=2.0)
        _report(core, "llm", 0, ranks=False)
        left = core.clock.time_ms()
        _clock(core).advance(60.0)
        core.job_progress("llm", step, at_ms=core.clock.time_ms(), phase="completed")
        _report(core, "llm", step, pid=300)
        rec = core.jobs.job("llm")
        assert rec is not None and (rec.state, rec.end_reason, rec.ended_ms, rec.history) == (
            ENDED,
            "completed",
            left,
            [],
        )

    def test_ranks_back_with_new_processes_are_a_restart_the_controller_did_not_make(self, core: DecisionCore) -> None:
        """The job failed by itself and its scheduler restarted it: one ``unrecorded`` restart, the gap
        down; the same processes back (an agent restart) would not be one."""
        step = _run(core, "llm", hours=1.0)
        _report(core, "llm", 0, ranks=False)
        _clock(core).advance(HOUR_S / 2)
        back = step - 300
        _report(core, "llm", back, pid=200, resumed=back)  # restarted from its checkpoint, new pids
        rec = core.jobs.job("llm")
        assert rec is not None and rec.state == RESUMING and rec.ended_ms is None
        _clock(core).advance(60.0)
        _report(core, "llm", back + 1, pid=200, resumed=back)  # its first step
        rec = core.jobs.job("llm")
        assert rec is not None and rec.state == RUNNING
        first = core.clock.time_ms()
        assert [(h.reason, h.interrupted_ms, h.first_step_ms, h.steps_lost) for h in rec.history] == [
            ("unrecorded", first - int(HOUR_S / 2 * 1000) - 60_000, first, 300)
        ]
        report = StoreQueries(core.store, core.clock).fleet_report(86400.0)
        assert report.by_cause.get("software_job") == 1

    def test_the_same_processes_back_after_a_blink_are_not_a_restart(self, core: DecisionCore) -> None:
        step = _run(core, "llm", hours=1.0)
        _report(core, "llm", 0, ranks=False)
        _clock(core).advance(10.0)
        _report(core, "llm", step + 5)
        rec = core.jobs.job("llm")
        assert rec is not None and (rec.state, rec.history, rec.ended_ms) == (RUNNING, [], None)

    def test_an_eviction_after_the_ranks_died_counts_from_when_they_died(self, core: DecisionCore) -> None:
        """A GPU fault killed the ranks before the healer acted: the interruption began when they left."""
        _run(core, "llm", hours=1.0)
        _report(core, "llm", 0, ranks=False)
        died = core.clock.time_ms()
        _clock(core).advance(30.0)
        core.jobs.mark_interrupted("llm", core.clock.time_ms(), "gpu_fault on node-001")
        rec = core.jobs.job("llm")
        assert rec is not None and rec.state != ENDED
        assert [(h.reason, h.interrupted_ms) for h in rec.history] == [("gpu_fault on node-001", died)]

    def test_the_end_survives_a_restart_of_the_controller(self, core: DecisionCore, tmp_path: Path) -> None:
        _run(core, "llm", hours=2.0)
        core.job_progress("llm", 1200, at_ms=core.clock.time_ms(), phase="failed")
        again = DecisionCore(core.config, core.clock, core.store, ControllerMetrics())
        rec = again.jobs.job("llm")
        assert rec is not None and (rec.state, rec.end_reason) == (ENDED, "failed")
        _clock(core).advance(5 * HOUR_S)
        assert _job(again, "llm").wall_s == pytest.approx(2 * HOUR_S)

    def test_an_older_database_gains_the_end_columns(self, tmp_path: Path) -> None:
        """heal_jobs from before jobs could end upgrades in place; its jobs read as not ended."""
        store = Store(tmp_path / "old.db")
        try:
            store.connection.execute(
                "CREATE TABLE heal_jobs (job TEXT PRIMARY KEY, checkpoint_dir TEXT NOT NULL DEFAULT '', "
                "declared_nodes TEXT NOT NULL DEFAULT '[]', world_size INTEGER NOT NULL DEFAULT 0, "
                "last_complete_step INTEGER NOT NULL DEFAULT 0, last_complete_path TEXT NOT NULL DEFAULT '', "
                "last_complete_ms INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL DEFAULT 'running', "
                "first_seen_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL)"
            )
            store.connection.execute("INSERT INTO heal_jobs(job, first_seen_ms, updated_ms) VALUES ('old', 1, 1)")
            clock = FakeClock()
            core = DecisionCore(ControllerConfig(db_path=tmp_path / "old.db"), clock, store, ControllerMetrics())
            rec = core.jobs.job("old")
            assert rec is not None and (rec.state, rec.ended_ms) == (RUNNING, None)
            core.job_progress("old", 1, at_ms=clock.time_ms(), phase="completed")
            again = DecisionCore(ControllerConfig(db_path=tmp_path / "old.db"), clock, store, ControllerMetrics())
            assert again.jobs.job("old") is not None
            assert again.jobs.job("old").state == ENDED  # type: ignore[union-attr]
        finally:
            store.close()
