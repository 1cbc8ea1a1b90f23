"""The query surface: the store-backed answers (what a standby serves) match the leader's live ones.

A real controller (real SQLite) opens incidents from hand-made conditions and registers
nodes and a job; a second ``Store`` on the same file stands for the standby's replicated copy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Condition, ConditionChange
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, generate_fabric
from controller.heal.acks import acknowledge
from controller.heal.states import NodeHealState, RemediationStore
from controller.query.store import StoreQueries
from controller.query.surface import Queries
from controller.service import Controller, ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

T0_MS = 1_700_000_000_000


def xid(clock: FakeClock, node: str, gpu: int) -> Condition:
    t = clock.time_ms()
    return Condition(
        rule="xid_79",
        component=f"{node}/gpu-{gpu}",
        component_type="gpu",
        category="gpu",
        node=node,
        severity="fatal",
        action="reset_gpu",
        message=f"xid 79 on {node}/gpu-{gpu}",
        first_seen_ms=t,
        last_seen_ms=t,
    )


@pytest.fixture
def fabric() -> Fabric:
    return generate_fabric(nodes=4, gpus_per_node=8, rails=2, nodes_per_block=2, spines=1, spares=0)


@pytest.fixture
async def ctl(tmp_path: Path, fabric: Fabric) -> AsyncIterator[Controller]:
    clock = FakeClock(T0_MS)
    correlation = CorrelationConfig(settle_s=0, resolve_hold_s=0)
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        detection=DetectionConfig(correlation=correlation),
        jobs={"llama": ["node-000", "node-001"]},
    )
    controller = Controller(config, clock=clock)
    for name in fabric.nodes():
        inv = ipb.Inventory(gpus=[ipb.GpuInfo() for _ in range(8)])
        controller.registry.register(spb.Hello(node_id=name, role=ipb.NODE_ROLE_COMPUTE, inventory=inv))
    yield controller
    controller.store.close()


def feed(ctl: Controller, kind: str, *conditions: Condition) -> None:
    ctl.detection.correlator.on_changes([ConditionChange(kind, c) for c in conditions])  # type: ignore[arg-type]
    ctl.detection.tick()


@pytest.fixture
def standby(tmp_path: Path, ctl: Controller) -> StoreQueries:
    """The standby's view: another connection to the file the leader writes (its mirror's copy)."""
    return StoreQueries(Store(tmp_path / "c.db"), FakeClock(T0_MS))


def open_two(ctl: Controller) -> tuple[str, str]:
    assert isinstance(ctl.clock, FakeClock)
    feed(ctl, "opened", xid(ctl.clock, "node-000", 1))
    ctl.clock.advance(1)
    feed(ctl, "opened", xid(ctl.clock, "node-002", 3))
    ids = [i.id for i in ctl.queries.open_incidents()]
    assert len(ids) == 2
    return ids[0], ids[1]


def summary(q: Queries, include_resolved: bool = False) -> list[tuple[str, str, list[str], bool]]:
    return [(i.id, i.root_cause, i.affected_nodes, i.active) for i in q.incidents(include_resolved, 100)]


class TestStoreQueries:
    def test_open_incidents_match_the_leaders(self, ctl: Controller, standby: StoreQueries) -> None:
        """The store alone lists the same open incidents, newest first, as the leader's correlator."""
        newest, oldest = open_two(ctl)
        assert summary(standby) == summary(ctl.queries)
        assert [(i.id, i.evidence) for i in standby.open_incidents()] == [
            (i.id, i.evidence) for i in ctl.queries.open_incidents()
        ]
        assert [i.id for i in standby.incidents()] == [newest, oldest]
        assert standby.incident(oldest) == ctl.queries.incident(oldest)
        assert standby.incident("inc-999999") is None

    def test_a_resolved_incident_is_listed_only_with_resolved_ones(
        self, ctl: Controller, standby: StoreQueries
    ) -> None:
        assert isinstance(ctl.clock, FakeClock)
        condition = xid(ctl.clock, "node-001", 2)
        feed(ctl, "opened", condition)
        (incident,) = ctl.queries.open_incidents()
        ctl.clock.advance(5)
        done = replace(condition, resolved_ms=ctl.clock.time_ms(), last_seen_ms=ctl.clock.time_ms())
        feed(ctl, "resolved", done)
        assert standby.incidents() == [] == ctl.queries.open_incidents()
        assert summary(standby, include_resolved=True) == summary(ctl.queries, include_resolved=True)
        stored = standby.incident(incident.id)
        assert stored is not None and not stored.active

    def test_timeline_and_ack_come_from_the_file(self, ctl: Controller, standby: StoreQueries) -> None:
        """An incident's history, its nodes' remediation and the ack: all read from SQLite."""
        _, oldest = open_two(ctl)
        RemediationStore(ctl.store.connection, ctl.clock).transition("node-000", NodeHealState.CORDONED, "xid", oldest)
        acknowledge(ctl.store.connection, oldest, "alice", "looking", T0_MS + 5000)
        timeline = standby.incident_timeline(oldest)
        assert timeline[0]["what"] == "opened"
        assert {"what": "in_service -> cordoned", "node": "node-000"}.items() <= timeline[1].items()
        assert timeline[-1]["what"] == "acked" and timeline[-1]["by"] == "alice"
        assert timeline == ctl.queries.incident_timeline(oldest)
        ack = standby.incident_ack(oldest)
        assert ack is not None and ack.actor == "alice"

    def test_nodes_jobs_and_lifecycle(self, ctl: Controller, standby: StoreQueries) -> None:
        RemediationStore(ctl.store.connection, ctl.clock).transition("node-003", NodeHealState.CORDONED, "by hand")
        rows = standby.node_statuses()
        assert [r.node_id for r in rows] == [r.node_id for r in ctl.queries.node_statuses()]
        assert [r.node_id for r in standby.node_statuses([NodeHealState.CORDONED])] == ["node-003"]
        assert standby.lifecycle()["node-003"].state == NodeHealState.CORDONED
        jobs = standby.jobs()
        assert jobs is not None and [(j.job, j.nodes) for j in jobs] == [("llama", ["node-000", "node-001"])]

    def test_topology_is_the_leaders_alone(self, ctl: Controller, standby: StoreQueries, fabric: Fabric) -> None:
        """A standby does not reconcile LLDP (None); the leader's view carries the declared fabric."""
        assert standby.topology() is None and standby.fabric() is None
        view = ctl.queries.topology()
        assert view is not None and view.summary == fabric.summary() and view.nodes_reporting_lldp == 0
        assert ctl.queries.fabric() is fabric
