"""The fleet report on a known history: exact rates, MTTR, ETTR, wrongful evictions, lemons.

The history is written through the controller's own stores (incidents, the remediation
state machine, the job registry, the in-service ledger) on a FakeClock, so the rows are the
ones a running controller writes; the expected figures are worked out by hand below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.heal import repair
from controller.heal.inservice import FleetServiceLedger, service_intervals
from controller.heal.states import NodeHealState, RemediationStore
from controller.jobs.registry import JobRegistry
from controller.query.fleet import JobFigures, ReportSettings, cause_of, fleet_report
from controller.query.store import StoreQueries
from controller.store import Store
from starpulse.core.clock import FakeClock

S = NodeHealState
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
T0 = 1_700_000_000_000
History = tuple[Store, FakeClock]


def _incident(kind: str, node: str, at_ms: int, rules: list[str], jobs: list[str] | None = None) -> Incident:
    return Incident(
        id="", kind=kind, root_cause=f"{node}/x", component_type="gpu", affected_nodes=[node],
        affected_jobs=jobs or [], severity="critical", action="drain",
        evidence=[{"rule": r} for r in rules], opened_ms=at_ms,
    )  # fmt: skip


def _evict_and_return(heal: RemediationStore, clock: FakeClock, node: str, incident: str, out_s: float) -> None:
    """The healer's path for one node: drain -> evicted -> repairing -> validating -> in service."""
    heal.transition(node, S.DRAINING, "drain", incident)
    heal.transition(node, S.EVICTED, "evicted", incident)
    heal.transition(node, S.REPAIRING, "reset", incident)
    clock.advance(out_s - 60)
    heal.transition(node, S.VALIDATING, "validate", incident)
    clock.advance(60)
    heal.transition(node, S.IN_SERVICE, "back", incident)


def _save_repair(store: Store, node: str, incident: str, steps: list[tuple[str, bool]], at_ms: int) -> None:
    """The repair record as RepairLoop writes it (one row per node, its evidence as JSON)."""
    store.connection.executescript(repair._SCHEMA)  # the repair loop's own table
    evidence = [{"at_ms": at_ms, "step": s, "ok": ok, "detail": ""} for s, ok in steps]
    store.connection.execute(
        "INSERT OR REPLACE INTO heal_repairs(node, incident_id, kind, rung, started_ms, evidence) "
        "VALUES (?, ?, 'gpu_fault', 0, ?, ?)",
        (node, incident, at_ms, json.dumps(evidence)),
    )


@pytest.fixture
def history(tmp_path: Path) -> History:
    """Ten days of a four-node, 8-GPU fleet; node-3 retired at day 5 (35 node-days, 280 GPU-days).

    Faults: an Xid on node-0 (gpu), a DBE on node-1 (hbm_ecc), a NIC on node-2, a link (switch/cable),
    one incident merged into another (not counted again), and a restart no incident explains
    (software/job): 5. node-0 is back 1 h after its fault, node-1 after 3 h.
    Job "llm" (16 GPUs, ranks on node-0 and node-1, 2 s a step) runs all 10 days; node-0's fault
    stops it at step 50,000 with its last checkpoint at 49,100: down 30 min, 900 steps lost (1,800 s).
    """
    clock = FakeClock(start_ms=T0)
    store = Store(tmp_path / "c.db")
    ledger = FleetServiceLedger(store.connection)
    nodes = {f"node-{i}": (8, T0) for i in range(4)}
    ledger.sync(nodes, set(), T0)
    incidents = IncidentStore(store.connection)
    heal = RemediationStore(store.connection, clock)
    jobs = JobRegistry(store.connection, clock)
    jobs.register_job("llm", ["node-0", "node-1"])
    ids: dict[str, str] = {}

    clock.set_ms(T0 + 1 * DAY_MS)
    ids["xid"] = incidents.open(_incident("gpu_fault", "node-0", clock.time_ms(), ["gpu.xid.reboot"], ["llm"])).id
    jobs.mark_interrupted("llm", clock.time_ms(), "gpu_fault on node-0")
    jobs.mark_resumed("llm", clock.time_ms() + 10 * 60_000, 49_100)
    # the ranks' step at the fault and their first step after it (their samples are not replayed here)
    store.connection.execute(
        "UPDATE heal_job_restarts SET interrupted_step = 50000, first_step_ms = ?, first_step = 49101 "
        "WHERE job = 'llm'",
        (clock.time_ms() + 30 * 60_000,),
    )
    # ...and the job running again, as the registry keeps it once it has seen that step (read back
    # as a restarted controller would): a later requeue is a new interruption, not this one again
    store.connection.execute("UPDATE heal_jobs SET state = 'running' WHERE job = 'llm'")
    jobs = JobRegistry(store.connection, clock)
    _evict_and_return(heal, clock, "node-0", ids["xid"], 3600)
    _save_repair(store, "node-0", ids["xid"], [("reset", True), ("scan", True), ("evidence_quiet", True)], T0)

    clock.set_ms(T0 + 2 * DAY_MS)
    ids["dbe"] = incidents.open(_incident("gpu_fault", "node-1", clock.time_ms(), ["gpu.ecc_dbe"])).id
    _evict_and_return(heal, clock, "node-1", ids["dbe"], 3 * 3600)
    _save_repair(store, "node-1", ids["dbe"], [("reset", True), ("diagnostic:dcgm", False), ("reboot", True)], T0)

    clock.set_ms(T0 + 3 * DAY_MS)
    ids["nic"] = incidents.open(_incident("nic_fault", "node-2", clock.time_ms(), ["nic.port_down"])).id
    merged = incidents.open(_incident("nic_fault", "node-2", clock.time_ms() + 1000, ["nic.flap"]))
    incidents.resolve(merged, clock.time_ms() + 2000, merged_into=ids["nic"])
    clock.set_ms(T0 + 4 * DAY_MS)
    incidents.open(_incident("link_fault", "node-2", clock.time_ms(), ["nic.phy_errors"]))
    clock.set_ms(T0 + 5 * DAY_MS)
    jobs.mark_resumed("llm", clock.time_ms(), 49_100)  # the scheduler restarted it; no incident, no downtime seen
    store.connection.execute(
        "UPDATE heal_job_restarts SET first_step_ms = interrupted_ms, first_step = 49101, interrupted_step = 49100 "
        "WHERE job = 'llm' AND reason = 'unrecorded'"
    )
    heal.transition("node-3", S.CORDONED, "rma", None, actor="alice")
    heal.transition("node-3", S.RETIRED, "rma", None, actor="alice")
    ledger.sync(nodes, {"node-3"}, clock.time_ms())
    # the ranks, as the registry persists them: 16 of them, 2 s a step, heard until the window's end
    for rank in range(16):
        store.connection.execute(
            "INSERT INTO heal_job_ranks(job, rank, node, step, step_time_s, last_checkpoint_step, checkpoint_path, "
            "last_checkpoint_ms, pid, world_size, updated_ms) VALUES ('llm', ?, ?, 0, 2.0, 0, '', 0, 1, 16, ?)",
            (rank, f"node-{rank // 8}", T0 + 10 * DAY_MS),
        )
    store.connection.execute("UPDATE heal_jobs SET world_size = 16, first_seen_ms = ?", (T0,))
    clock.set_ms(T0 + 10 * DAY_MS)
    return store, clock


def test_a_known_history_gives_the_exact_rate_mttr_and_ettr(history: History) -> None:
    store, _ = history
    report = fleet_report(store.connection, T0, T0 + 10 * DAY_MS)
    assert report.node_days == pytest.approx(35.0)
    assert report.gpu_days == pytest.approx(280.0)
    assert (report.nodes_in_service, report.gpus_in_service) == (3, 24)
    assert report.faults == 5
    assert report.by_cause == {"gpu": 1, "hbm_ecc": 1, "nic": 1, "switch_cable": 1, "software_job": 1}
    body = report.to_dict()
    assert body["faults"]["per_1000_gpu_days"] == pytest.approx(5 * 1000 / 280)
    assert body["faults"]["per_1000_node_days"] == pytest.approx(5 * 1000 / 35)
    assert body["faults"]["by_cause"]["hbm_ecc"]["per_1000_gpu_days"] == pytest.approx(1000 / 280)
    assert report.mtbf_fleet_h == pytest.approx(240 / 5)
    assert report.mtbf_node_h == pytest.approx(35 * 24 / 5)
    assert sorted(report.mttr_pool_s) == [3600.0, 3 * 3600.0]
    assert body["mttr"]["fault_to_node_back_in_pool"]["mean_s"] == pytest.approx(7200.0)
    assert report.mttr_job_s == [30 * 60.0]  # fault -> the job's first step after the restart
    (llm,) = report.jobs
    assert (llm.basis, llm.gpus, llm.interruptions, llm.steps_lost) == ("steps", 16, 2, 900)
    assert llm.downtime_s == pytest.approx(1800.0)
    assert llm.redo_s == pytest.approx(1800.0)
    wall = 10 * 86400.0
    assert llm.ettr == pytest.approx((wall - 1800 - 1800) / wall)
    assert report.fleet_ettr == pytest.approx(llm.ettr)
    assert llm.gpu_hours_lost == pytest.approx(16 * 3600 / 3600)
    assert llm.mean_time_between_interruptions_s == pytest.approx(wall / 2)
    # node-0: repair found nothing, no incident for 7 days after it came back: wrongful.
    # node-1: a diagnostic failed: a real fault, whatever happened after.
    assert [w["node"] for w in report.wrongful] == ["node-0"]
    assert report.evictions == 2
    assert report.lemons == []


def test_a_wrongful_eviction_needs_the_clean_time_to_have_passed(
    history: History,
) -> None:
    store, _ = history
    early = fleet_report(store.connection, T0, T0 + 5 * DAY_MS)  # node-0 back on day 1: 4 clean days so far
    assert (early.wrongful, early.wrongful_pending) == ([], 1)
    short = fleet_report(store.connection, T0, T0 + 5 * DAY_MS, ReportSettings(clean_s=3 * 86400.0))
    assert [w["node"] for w in short.wrongful] == ["node-0"]


def test_a_fault_within_the_clean_time_makes_the_eviction_rightful(
    history: History,
) -> None:
    store, _ = history
    IncidentStore(store.connection).open(_incident("gpu_fault", "node-0", T0 + 3 * DAY_MS, ["gpu.xid.reboot"]))
    report = fleet_report(store.connection, T0, T0 + 10 * DAY_MS)
    assert report.wrongful == []
    assert report.by_cause["gpu"] == 2


def test_lemons_are_nodes_with_repeated_faults_in_the_window(history: History) -> None:
    store, _ = history
    incidents = IncidentStore(store.connection)
    for day in (6, 7, 8):
        incidents.open(_incident("gpu_fault", "node-1", T0 + day * DAY_MS, ["gpu.xid.reboot"]))
    report = fleet_report(store.connection, T0, T0 + 10 * DAY_MS)
    assert report.lemons == [{"node": "node-1", "faults": 4, "false_validations": 0}]
    fewer = fleet_report(store.connection, T0, T0 + 10 * DAY_MS, ReportSettings(lemon_window_s=2.5 * 86400))
    assert fewer.lemons == []  # only days 8 (and 7.5+) inside a 2.5-day window: 1 fault


def test_the_figures_are_the_same_after_a_restart_and_without_events(tmp_path: Path, history: History) -> None:
    """Computed from incidents, remediations and job records: a reopened file (a restarted
    controller, a standby's copy) with its events gone gives the same report."""
    store, clock = history
    before = StoreQueries(store, clock).fleet_report(10 * 86400.0).to_dict()
    store.connection.execute("DELETE FROM events")
    store.close()
    again = Store(tmp_path / "c.db")
    try:
        FleetServiceLedger(again.connection)  # a restarted controller's ledger: nothing doubles
        assert StoreQueries(again, clock).fleet_report(10 * 86400.0).to_dict() == before
    finally:
        again.close()


def test_the_ledger_opens_at_first_sight_closes_on_retirement_and_reopens(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    try:
        ledger = FleetServiceLedger(store.connection)
        assert ledger.sync({"a": (8, T0), "b": (4, T0 + HOUR_MS)}, set(), T0 + 2 * HOUR_MS) == 2
        assert ledger.sync({"a": (8, T0), "b": (4, T0 + HOUR_MS)}, set(), T0 + 3 * HOUR_MS) == 0
        ledger.sync({"a": (8, T0), "b": (4, T0 + HOUR_MS)}, {"b"}, T0 + 5 * HOUR_MS)
        restarted = FleetServiceLedger(store.connection)  # a new controller: the first sighting is not redone
        restarted.sync({"a": (8, T0), "b": (4, T0 + HOUR_MS)}, set(), T0 + 9 * HOUR_MS)
        rows = sorted((i.node, i.gpus, i.from_ms - T0, None if i.to_ms is None else i.to_ms - T0)
                      for i in service_intervals(store.connection, T0, T0 + DAY_MS))  # fmt: skip
        assert rows == [("a", 8, 0, None), ("b", 4, HOUR_MS, 5 * HOUR_MS), ("b", 4, 9 * HOUR_MS, None)]
        report = fleet_report(store.connection, T0, T0 + 10 * HOUR_MS)
        assert report.gpu_days == pytest.approx((8 * 10 + 4 * 4 + 4 * 1) / 24)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kind", "rules", "cause"),
    [
        ("gpu_fault", ["gpu.xid.reboot"], "gpu"),
        ("gpu_fault", ["gpu.remap_failure"], "hbm_ecc"),
        ("gpu_fault", ["gpu.nvlink_down"], "nvlink"),
        ("gpu_fault", ["gpu.sxid.reboot"], "nvlink"),
        ("nic_fault", ["nic.port_down"], "nic"),
        ("switch_fault", [], "switch_cable"),
        ("partition", [], "switch_cable"),
        ("node_down", [], "host"),
        ("straggler", [], "fail_slow"),
        ("other", [], "other"),
    ],
)
def test_causes_fold_incident_kinds_into_the_review_buckets(kind: str, rules: list[str], cause: str) -> None:
    assert cause_of(kind, [{"rule": r} for r in rules]) == cause


def test_a_job_without_step_reports_gets_a_downtime_only_upper_bound(tmp_path: Path) -> None:
    clock = FakeClock(start_ms=T0)
    store = Store(tmp_path / "c.db")
    try:
        FleetServiceLedger(store.connection).sync({"n": (8, T0)}, set(), T0)
        jobs = JobRegistry(store.connection, clock)
        jobs.register_job("batch", ["n"])
        clock.set_ms(T0 + DAY_MS)
        jobs.mark_interrupted("batch", clock.time_ms(), "gpu_fault on n")
        jobs.mark_resumed("batch", clock.time_ms() + 2 * HOUR_MS, 0)
        (job,) = fleet_report(store.connection, T0, T0 + 4 * DAY_MS).jobs
        assert (job.basis, job.gpus, job.ettr_is_upper_bound, job.redo_s) == ("scheduler", 8, True, None)
        assert job.ettr == pytest.approx(1 - 2 / 96)
    finally:
        store.close()


def test_short_spans_place_downtime_and_redo_where_they_happen(history: History) -> None:
    """The known history's fault (day 1, 00:00): down 30 min, then 30 min redoing the 900 steps lost.

    Per span the lost time is counted where it falls: the redo after the first step of the run, the
    interruption (its steps and its MTTR) once, in the span it started in. Spans summed give the
    whole window's figures."""
    store, _ = history
    day1 = T0 + DAY_MS

    def llm(since: int, until: int) -> JobFigures:
        (job,) = fleet_report(store.connection, since, until).jobs
        return job

    first = llm(day1, day1 + 20 * 60_000)  # down all of it
    assert (first.downtime_s, first.redo_s, first.interruptions, first.steps_lost) == (1200.0, 0.0, 1, 900)
    assert first.ettr == 0.0
    second = llm(day1 + 20 * 60_000, day1 + 40 * 60_000)  # 10 min down, then 10 min of redo
    assert (second.downtime_s, second.redo_s, second.interruptions, second.steps_lost) == (600.0, 600.0, 0, 0)
    assert second.ettr == 0.0
    third = llm(day1 + 50 * 60_000, day1 + 80 * 60_000)  # the redo's last 10 min, then 20 productive
    assert (third.downtime_s, third.redo_s) == (0.0, 600.0)
    assert third.ettr == pytest.approx(2 / 3)
    # hours that straddle midnight: the interruption counted once, its MTTR once
    spans = [fleet_report(store.connection, T0 + h * HOUR_MS, T0 + (h + 1) * HOUR_MS) for h in range(22, 27)]
    assert sum(j.interruptions for r in spans for j in r.jobs if j.job == "llm") == 1
    assert sum(len(r.mttr_job_s) for r in spans) == 1
    whole = llm(T0 + 22 * HOUR_MS, T0 + 27 * HOUR_MS)
    assert sum(j.downtime_s + (j.redo_s or 0) for r in spans for j in r.jobs) == pytest.approx(
        whole.downtime_s + (whole.redo_s or 0)
    )
    days = [llm(T0 + d * DAY_MS, T0 + (d + 1) * DAY_MS) for d in range(10)]
    assert [round(d.ettr or -1.0, 6) for d in days] == [1.0, round(1 - 3600 / 86400, 6)] + [1.0] * 8
