"""Bounded history: raw rows kept for the horizon, daily aggregates beyond it, same report.

A hundred days of a two-node fleet with faults on days 1, 50 and 95; with a 30-day horizon the
sweep aggregates days 0-69 and deletes their raw rows, and the 100-day report is what it was
before the sweep. A database written before this release upgrades in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core import DecisionCore
from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.heal.inservice import FleetServiceLedger
from controller.heal.states import NodeHealState, RemediationStore
from controller.metrics import ControllerMetrics
from controller.query.fleet import fleet_report
from controller.query.history import HistoryKeeper, report_with_history
from controller.settings import ControllerConfig
from controller.store import Store, StoredNode
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

DAY_MS = 86_400_000
T0 = 1_700_006_400_000  # a UTC midnight
S = NodeHealState


def _fault(store: Store, heal: RemediationStore, clock: FakeClock, node: str, day: int, rules: list[str]) -> None:
    clock.set_ms(T0 + day * DAY_MS)
    inc = IncidentStore(store.connection).open(
        Incident(id="", kind="gpu_fault", root_cause=f"{node}/gpu-0", component_type="gpu", affected_nodes=[node],
                 affected_jobs=[], severity="critical", action="reboot", evidence=[{"rule": r} for r in rules],
                 opened_ms=clock.time_ms())
    )  # fmt: skip
    store.insert_events(node, "ep", [tpb.Event(seq=day, timestamp_ms=clock.time_ms(), xid=79)], clock.time_ms(), day)
    for state in (S.DRAINING, S.EVICTED, S.VALIDATING):
        heal.transition(node, state, "r", inc.id)
    heal.mark_action(heal.plan_action(node, "drain", inc.id).action_id, "done")
    clock.advance(3600 * (day % 7 + 1))
    heal.transition(node, S.IN_SERVICE, "back", inc.id)
    IncidentStore(store.connection).resolve(inc, clock.time_ms())


@pytest.fixture
def hundred_days(tmp_path: Path) -> tuple[Store, FakeClock]:
    clock = FakeClock(start_ms=T0)
    store = Store(tmp_path / "c.db")
    for node in ("a", "b"):
        store.upsert_node(StoredNode(node, ipb.NODE_ROLE_COMPUTE, "online", T0, T0, "", "", ipb.Inventory(), "ep", 0))
    FleetServiceLedger(store.connection).sync({"a": (8, T0), "b": (8, T0)}, set(), T0)
    heal = RemediationStore(store.connection, clock)
    _fault(store, heal, clock, "a", 1, ["gpu.xid.reboot"])
    _fault(store, heal, clock, "b", 50, ["gpu.ecc_dbe"])
    _fault(store, heal, clock, "a", 95, ["gpu.xid.reboot"])
    clock.set_ms(T0 + 100 * DAY_MS)
    return store, clock


def _figures(report: object) -> dict[str, object]:
    body = report.to_dict()  # type: ignore[attr-defined]
    return {
        "faults": body["faults"]["total"],
        "by_cause": {k: v["count"] for k, v in body["faults"]["by_cause"].items()},
        "gpu_days": round(body["fleet"]["gpu_days"], 6),
        "mttr_pool_mean_s": round(body["mttr"]["fault_to_node_back_in_pool"]["mean_s"], 6),
        "mttr_pool_n": body["mttr"]["fault_to_node_back_in_pool"]["count"],
        "evictions": body["evictions"]["total"],
        "wrongful": body["evictions"]["wrongful"],
    }


def test_aggregates_beyond_the_horizon_give_the_same_report(hundred_days: tuple[Store, FakeClock]) -> None:
    store, clock = hundred_days
    now = clock.time_ms()
    before = _figures(fleet_report(store.connection, T0, now))
    assert before["faults"] == 3 and before["mttr_pool_n"] == 3
    deleted = HistoryKeeper(store.connection, retention_s=30 * 86400.0).sweep(now)
    assert deleted["events"] == 2 and deleted["incidents"] == 2  # days 1 and 50: older than day 70
    assert deleted["heal_pending_actions"] == 2
    assert store.count_events() == 1
    assert _figures(report_with_history(store.connection, T0, now)) == before
    # the raw rows alone no longer know the first 70 days
    assert fleet_report(store.connection, T0, now).faults == 1


def test_the_sweep_is_idempotent_and_days_are_aggregated_once(hundred_days: tuple[Store, FakeClock]) -> None:
    store, clock = hundred_days
    keeper = HistoryKeeper(store.connection, retention_s=30 * 86400.0)
    keeper.sweep(clock.time_ms())
    rows = store.connection.execute("SELECT COUNT(*), COUNT(DISTINCT day_ms) FROM reliability_daily").fetchone()
    assert keeper.sweep(clock.time_ms()) == {}
    assert store.connection.execute("SELECT COUNT(*), COUNT(DISTINCT day_ms) FROM reliability_daily").fetchone() == rows
    assert rows[1] == 70  # days 0..69, one marker row at least each
    clock.set_ms(clock.time_ms() + DAY_MS)
    keeper.sweep(clock.time_ms())
    assert store.connection.execute("SELECT COUNT(DISTINCT day_ms) FROM reliability_daily").fetchone()[0] == 71


def test_a_database_from_the_previous_release_upgrades_in_place(tmp_path: Path) -> None:
    """Nodes, incidents and events written before fleet_service existed: the decision core adds its
    tables and opens each node's interval at its first sighting, so the GPU-days are not lost."""
    clock = FakeClock(start_ms=T0 + 10 * DAY_MS)
    store = Store(tmp_path / "old.db")
    inventory = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(4)])
    store.upsert_node(StoredNode("n1", ipb.NODE_ROLE_COMPUTE, "online", T0, T0, "", "", inventory, "ep", 0))
    IncidentStore(store.connection)
    store.close()
    store = Store(tmp_path / "old.db")
    try:
        tables = {r[0] for r in store.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "fleet_service" not in tables and "reliability_daily" not in tables
        core = DecisionCore(ControllerConfig(db_path=tmp_path / "old.db"), clock, store, ControllerMetrics())
        core.sync_fleet_service()
        report = fleet_report(store.connection, T0, clock.time_ms())
        assert report.gpu_days == pytest.approx(40.0)  # 4 GPUs since the node was first seen, 10 days ago
    finally:
        store.close()
