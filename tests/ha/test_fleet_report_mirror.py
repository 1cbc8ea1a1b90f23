"""The fleet report after an HA failover: its tables reach the new leader through a real etcd.

The report reads incidents, remediation transitions and repairs, job records and the
``fleet_service`` intervals; all of them are mirrored like every other table, so a replica
restored from etcd gives the same figures, and a retention delete on the leader reaches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.ha.config import HAConfig
from controller.ha.election import Elector
from controller.ha.etcd import connect
from controller.ha.mirror import StateMirror
from controller.heal import repair
from controller.heal.inservice import FleetServiceLedger
from controller.heal.states import NodeHealState, RemediationStore
from controller.jobs.registry import JobRegistry
from controller.query.fleet import fleet_report
from controller.query.history import HistoryKeeper, report_with_history
from controller.store import Store
from starpulse.core.clock import FakeClock
from tests.etcd_server import EtcdServer

T0 = 1_700_000_000_000
DAY_MS = 86_400_000
Replica = tuple[Store, FakeClock, Elector, StateMirror]


@pytest.fixture
async def make(etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[Callable[[str], Awaitable[Replica]]]:
    config = HAConfig(etcd=[etcd.endpoint])
    made = []

    async def factory(name: str) -> Replica:
        client = await connect(config)
        clock = FakeClock(start_ms=T0)
        store = Store(tmp_path / f"{name}.db")
        FleetServiceLedger(store.connection)
        IncidentStore(store.connection)
        RemediationStore(store.connection, clock)
        JobRegistry(store.connection, clock)
        store.connection.executescript(repair._SCHEMA)
        HistoryKeeper(store.connection, 90 * 86400.0)  # the aggregates' tables, as the decision core makes them
        elector = Elector(client, config.key("leader"), f"{name}:1", 2, poll_interval_s=0.05)
        made.append((client, store))
        return store, clock, elector, StateMirror(store.connection, client, config, elector)

    yield factory
    for client, store in made:
        await client.close()
        store.close()


async def test_a_restored_replica_gives_the_same_report(make: Callable[[str], Awaitable[Replica]]) -> None:
    store, clock, elector, mirror = await make("a")
    assert await elector.campaign(asyncio.Event())
    FleetServiceLedger(store.connection).sync({"n1": (8, T0), "n2": (8, T0)}, set(), T0)
    clock.set_ms(T0 + DAY_MS)
    incident = IncidentStore(store.connection).open(
        Incident(id="", kind="gpu_fault", root_cause="n1/gpu-0", component_type="gpu", affected_nodes=["n1"],
                 affected_jobs=[], severity="critical", action="drain", evidence=[], opened_ms=clock.time_ms())
    )  # fmt: skip
    heal = RemediationStore(store.connection, clock)
    for state in (NodeHealState.DRAINING, NodeHealState.EVICTED, NodeHealState.VALIDATING):
        heal.transition("n1", state, "r", incident.id)
    clock.advance(2 * 3600)
    heal.transition("n1", NodeHealState.IN_SERVICE, "back", incident.id)
    until = T0 + 3 * DAY_MS
    before = fleet_report(store.connection, T0, until).to_dict()
    assert before["faults"]["total"] == 1 and before["fleet"]["gpu_days"] == pytest.approx(48.0)
    await mirror.flush()

    b_store, _, _, b_mirror = await make("b")
    await b_mirror.restore()
    assert fleet_report(b_store.connection, T0, until).to_dict() == before

    store.connection.execute("DELETE FROM fleet_service WHERE node = 'n2'")  # e.g. a retention sweep
    await mirror.flush()
    c_store, _, _, c_mirror = await make("c")
    await c_mirror.restore()
    assert fleet_report(c_store.connection, T0, until).gpu_days == pytest.approx(24.0)
    await elector.resign()


async def test_the_aggregates_beyond_the_horizon_reach_a_replica(make: Callable[[str], Awaitable[Replica]]) -> None:
    """The per-day, per-job and per-node rollups are mirrored like every table: after the leader's
    retention sweep a restored replica gives the same long-window report, jobs and lemons included."""
    store, clock, elector, mirror = await make("a")
    assert await elector.campaign(asyncio.Event())
    FleetServiceLedger(store.connection).sync({"n1": (8, T0)}, set(), T0)
    jobs = JobRegistry(store.connection, clock)
    jobs.register_job("llm", ["n1"], world_size=8)
    incidents = IncidentStore(store.connection)
    for day in (1, 2, 3):
        clock.set_ms(T0 + day * DAY_MS)
        inc = incidents.open(
            Incident(id="", kind="gpu_fault", root_cause="n1/gpu-0", component_type="gpu", affected_nodes=["n1"],
                     affected_jobs=["llm"], severity="critical", action="drain", evidence=[],
                     opened_ms=clock.time_ms())
        )  # fmt: skip
        incidents.resolve(inc, clock.time_ms() + 60_000)
    JobRegistry(store.connection, clock).mark_interrupted("llm", T0 + DAY_MS, "gpu_fault on n1")
    JobRegistry(store.connection, clock).mark_resumed("llm", T0 + DAY_MS + 3_600_000, 0)
    clock.set_ms(T0 + 12 * DAY_MS)
    HistoryKeeper(store.connection, 5 * 86400.0).sweep(clock.time_ms())  # days 0-6 aggregated, raw rows gone
    assert store.connection.execute("SELECT COUNT(*) FROM incidents").fetchone()[0] == 0
    before = report_with_history(store.connection, T0, clock.time_ms()).to_dict()
    assert before["faults"]["total"] == 3 and before["lemons"]["nodes"] == [
        {"node": "n1", "faults": 3, "false_validations": 0}
    ]
    assert before["ettr"]["jobs"][0]["interruptions"] == 1
    await mirror.flush()
    b_store, _, _, b_mirror = await make("b")
    await b_mirror.restore()
    assert report_with_history(b_store.connection, T0, clock.time_ms()).to_dict() == before
    await elector.resign()


async def test_a_jobs_end_and_the_aggregates_expiry_reach_a_replica(make: Callable[[str], Awaitable[Replica]]) -> None:
    """Issue 28 leftovers: a job's end (its new columns) is mirrored, so a new leader's report stops
    its wall time where the old leader's did; the aggregates' own expiry deletes reach the mirror."""
    store, clock, elector, mirror = await make("a")
    assert await elector.campaign(asyncio.Event())
    FleetServiceLedger(store.connection).sync({"n1": (8, T0)}, set(), T0)
    jobs = JobRegistry(store.connection, clock)
    jobs.register_job("llm", ["n1"], world_size=8)
    clock.set_ms(T0 + 2 * DAY_MS)
    jobs.end_job("llm", clock.time_ms(), "completed")
    clock.set_ms(T0 + 20 * DAY_MS)
    keeper = HistoryKeeper(store.connection, 5 * 86400.0, aggregate_retention_s=10 * 86400.0)
    keeper.sweep(clock.time_ms())  # days 0-14 aggregated, those before day 10 expired again
    days = store.connection.execute("SELECT MIN(day_ms), MAX(day_ms) FROM reliability_daily").fetchone()
    assert days == (T0 // DAY_MS * DAY_MS + 10 * DAY_MS, T0 // DAY_MS * DAY_MS + 14 * DAY_MS)
    await mirror.flush()
    b_store, b_clock, _, b_mirror = await make("b")
    await b_mirror.restore()
    restored = JobRegistry(b_store.connection, b_clock).job("llm")
    assert restored is not None and (restored.state, restored.end_reason) == ("ended", "completed")
    assert restored.ended_ms == T0 + 2 * DAY_MS
    assert b_store.connection.execute("SELECT MIN(day_ms) FROM reliability_daily").fetchone() == (days[0],)
    window = (T0, T0 + 3 * DAY_MS)
    wall = [j.wall_s for j in fleet_report(b_store.connection, *window).jobs]
    assert wall == [j.wall_s for j in fleet_report(store.connection, *window).jobs] == [2 * 86400.0]
    await elector.resign()
