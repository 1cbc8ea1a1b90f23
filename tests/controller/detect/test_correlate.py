"""Correlation: conditions grouped on the fabric into incidents with one root cause."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from controller.detect.correlate import CorrelationConfig, Correlator
from controller.detect.incidents import IncidentStore
from controller.detect.model import Condition, ConditionChange
from controller.fabric import Fabric, generate_fabric
from starpulse.core import vocab
from starpulse.core.clock import FakeClock
from starpulse.core.vocab import EVICTABLE_KINDS
from tests.support import correlate as shared
from tests.support.correlate import gpu_xid, heartbeat, nic_down, node, opened, settle

# Pytest fixtures shared with the grouping and switch-witness tests.
clock = shared.clock
fabric = shared.fabric


@pytest.fixture
def store() -> IncidentStore:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    return IncidentStore(conn)


def switch_cond(
    component: str,
    clock: FakeClock,
    rule: str = "switch_port_down",
    category: str = "switch_port",
    severity: str = "critical",
    **evidence: object,
) -> Condition:
    return Condition(
        rule=rule,
        component=component,
        component_type="switch",
        category=category,
        node=None,
        severity=severity,  # type: ignore[arg-type]
        action="investigate",
        message=rule,
        first_seen_ms=clock.time_ms(),
        last_seen_ms=clock.time_ms(),
        evidence=dict(evidence),
    )


def resolved(clock: FakeClock, *conds: Condition) -> list[ConditionChange]:
    for c in conds:
        c.resolved_ms = clock.time_ms()
    return [ConditionChange("resolved", c) for c in conds]


def make(fabric: Fabric | None, store: IncidentStore, clock: FakeClock, **kw: object) -> Correlator:
    return Correlator(fabric, store, CorrelationConfig(settle_s=2.0, resolve_hold_s=60.0), clock=clock, **kw)  # type: ignore[arg-type]


def uplink_port(fabric: Fabric, leaf: str, spine: str) -> str:
    for k in range(64):
        port = f"Ethernet{4 * k}"
        if fabric.peer_at(leaf, port) == spine:
            return port
    raise AssertionError(f"{leaf} has no uplink to {spine}")


class TestCorrelator:
    def test_leaf_fault_is_one_incident_blaming_the_leaf(self, fabric, store, clock):
        """NICs of 16 nodes on leaf-b0-r3 down together are one switch_fault on leaf-b0-r3 with 16 nodes."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(*(nic_down(i, 3, clock) for i in range(16))))
        out = settle(corr, clock)
        assert [c for c, _ in out] == ["opened"]
        inc = out[0][1]
        assert (inc.kind, inc.root_cause, inc.component_type) == ("switch_fault", "leaf-b0-r3", "switch")
        assert inc.affected_nodes == [node(i) for i in range(16)]
        assert inc.action == "investigate_switch"
        assert not vocab.may_evict(inc.kind)
        assert len(corr.incidents()) == 1

    def test_leaf_own_conditions_join_the_leaf_incident(self, fabric, store, clock):
        """A leaf's PFC watchdog storm arriving with its NICs' errors is evidence in the same incident."""
        corr = make(fabric, store, clock)
        leaf_storm = switch_cond("leaf-b1-r2", clock, rule="pfc_watchdog_storm", category="switch")
        corr.on_changes(opened(nic_down(16, 2, clock), nic_down(17, 2, clock), leaf_storm))
        out = settle(corr, clock)
        assert len(out) == 1
        inc = out[0][1]
        assert inc.root_cause == "leaf-b1-r2"
        assert ("pfc_watchdog_storm", "leaf-b1-r2") in inc.condition_keys

    def test_nics_settling_separately_grow_one_incident(self, fabric, store, clock):
        """NICs arriving after the leaf incident opened update it instead of opening another."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(nic_down(0, 5, clock), nic_down(1, 5, clock)))
        first = settle(corr, clock)
        assert [(c, i.root_cause) for c, i in first] == [("opened", "leaf-b0-r5")]
        corr.on_changes(opened(nic_down(2, 5, clock), nic_down(3, 5, clock)))
        out = settle(corr, clock)
        assert [(c, i.id) for c, i in out] == [("updated", first[0][1].id)]
        assert len(out[0][1].affected_nodes) == 4
        assert len(corr.incidents()) == 1

    def test_leaf_fault_absorbs_open_nic_incident(self, fabric, store, clock):
        """An open per-NIC incident is closed as merged into the leaf incident that forms over it."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(nic_down(4, 3, clock)))
        ((change, lone),) = settle(corr, clock)
        assert (change, lone.kind) == ("opened", "nic_fault")
        corr.on_changes(opened(*(nic_down(i, 3, clock) for i in range(16) if i != 4)))
        out = settle(corr, clock)
        changes = {(c, i.kind) for c, i in out}
        assert changes == {("opened", "switch_fault"), ("resolved", "nic_fault")}
        leaf = next(i for c, i in out if c == "opened")
        assert store.merged_into(lone.id) == leaf.id
        assert [i.id for i in corr.incidents()] == [leaf.id]
        assert len(leaf.affected_nodes) == 16

    def test_spine_fault_from_uplinks_of_several_leaves(self, fabric, store, clock):
        """Uplink ports toward spine-2 down on leaves of different rails and blocks blame spine-2."""
        corr = make(fabric, store, clock)
        conds = [
            switch_cond(f"{leaf}:{uplink_port(fabric, leaf, 'spine-2')}", clock)
            for leaf in ("leaf-b0-r0", "leaf-b0-r4", "leaf-b1-r6")
        ]
        conds.append(switch_cond("spine-2", clock, rule="switch_silent", category="switch"))
        corr.on_changes(opened(*conds))
        out = settle(corr, clock)
        assert len(out) == 1
        inc = out[0][1]
        assert (inc.kind, inc.root_cause, inc.component_type) == ("switch_fault", "spine-2", "switch")
        assert inc.severity == "critical"
        assert len(inc.condition_keys) == 4
        assert inc.action == "investigate_switch"

    def test_single_uplink_is_a_link_fault(self, fabric, store, clock):
        """One leaf's uplink port toward a spine down, alone, blames that leaf-spine cable."""
        corr = make(fabric, store, clock)
        port = uplink_port(fabric, "leaf-b0-r1", "spine-5")
        corr.on_changes(opened(switch_cond(f"leaf-b0-r1:{port}", clock)))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause, inc.component_type) == ("link_fault", "leaf-b0-r1<->spine-5", "link")

    def test_silent_switch_alone_is_a_warning(self, fabric, store, clock):
        """A switch that only went silent is a switch_fault capped at warning: the collector may be what died."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(switch_cond("leaf-b0-r7", clock, rule="switch_silent", category="switch")))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause, inc.severity) == ("switch_fault", "leaf-b0-r7", "warning")

    def test_optic_on_cabled_port_is_a_link_fault(self, fabric, store, clock):
        """An optic alarm on a leaf port with a known cable blames the cable, not the switch."""
        corr = make(fabric, store, clock)
        port = fabric.port_of("node-020/nic-6")
        corr.on_changes(opened(switch_cond(f"leaf-b1-r6:{port}", clock, rule="optic_rx_power_low", category="switch")))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause) == ("link_fault", "node-020/nic-6<->leaf-b1-r6")
        assert inc.affected_nodes == ["node-020"]

    def test_lone_nic_is_a_nic_fault(self, fabric, store, clock):
        """A single NIC down with nothing else on its leaf is a nic_fault on that NIC."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(nic_down(9, 1, clock)))
        ((change, inc),) = settle(corr, clock)
        assert change == "opened"
        assert (inc.kind, inc.root_cause, inc.component_type) == ("nic_fault", "node-009/nic-1", "nic")
        assert inc.affected_nodes == ["node-009"]
        assert inc.action == "check_link"
        assert vocab.may_evict(inc.kind)

    def test_nic_with_switch_side_peer_is_a_link_fault(self, fabric, store, clock):
        """A NIC down plus the leaf reporting its peer port down is one link_fault on the cable."""
        corr = make(fabric, store, clock)
        port = fabric.port_of("node-005/nic-2")
        corr.on_changes(opened(nic_down(5, 2, clock), switch_cond(f"leaf-b0-r2:{port}", clock)))
        out = settle(corr, clock)
        assert len(out) == 1
        inc = out[0][1]
        assert (inc.kind, inc.root_cause, inc.component_type) == ("link_fault", "node-005/nic-2<->leaf-b0-r2", "link")
        assert len(inc.condition_keys) == 2
        assert not vocab.may_evict(inc.kind)

    def test_three_nics_of_one_node_are_a_node_fault(self, fabric, store, clock):
        """NICs on three rails of one node failing (and nothing else on those leaves) blame the node."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(nic_down(12, 0, clock), nic_down(12, 3, clock), nic_down(12, 7, clock)))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause, inc.component_type) == ("node_fault", "node-012", "node")

    def test_gpu_xid_is_a_gpu_fault(self, fabric, store, clock):
        """A GPU Xid condition becomes a gpu_fault on that GPU carrying the member's action."""
        corr = make(fabric, store, clock, jobs_of=lambda n: ["llama"] if n == "node-003" else [])
        corr.on_changes(opened(gpu_xid(3, 5, clock)))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause, inc.component_type) == ("gpu_fault", "node-003/gpu-5", "gpu")
        assert (inc.severity, inc.action) == ("fatal", "reboot")
        assert inc.affected_jobs == ["llama"]

    def test_three_gpus_of_one_node_are_a_node_fault(self, fabric, store, clock):
        """Three different GPUs of one node failing at once are one node_fault, not three gpu_faults."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(gpu_xid(7, 0, clock), gpu_xid(7, 1, clock), gpu_xid(7, 6, clock)))
        out = settle(corr, clock)
        assert [(i.kind, i.root_cause) for _, i in out] == [("node_fault", "node-007")]

    def test_heartbeats_lost_behind_one_block_are_one_partition(self, fabric, store, clock):
        """Five nodes of block 0 lost together are one partition blaming no node, and no node_down."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(*(heartbeat(i, clock) for i in (1, 3, 5, 8, 13))))
        out = settle(corr, clock)
        assert len(out) == 1
        inc = out[0][1]
        assert (inc.kind, inc.root_cause, inc.component_type) == ("partition", "", "network")
        assert (inc.severity, inc.action) == ("critical", "investigate_network")
        assert inc.affected_nodes == [node(i) for i in (1, 3, 5, 8, 13)]
        assert not vocab.may_evict(inc.kind)
        assert all(i.kind != "node_down" for i in corr.incidents())

    def test_heartbeats_split_across_blocks_are_node_downs(self, fabric, store, clock):
        """Two nodes in each of two blocks (below both thresholds) are per-node node_down incidents."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(*(heartbeat(i, clock) for i in (1, 2, 20, 21))))
        out = settle(corr, clock)
        assert sorted(i.kind for _, i in out) == ["node_down"] * 4
        assert all(not vocab.may_evict(i.kind) for _, i in out)

    def test_single_heartbeat_loss_is_node_down(self, fabric, store, clock):
        """One lost heartbeat is a node_down on that node with an investigate action."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(heartbeat(30, clock)))
        ((_, inc),) = settle(corr, clock)
        assert (inc.kind, inc.root_cause, inc.component_type, inc.action) == (
            "node_down",
            "node-030",
            "node",
            "investigate",
        )

    def test_partition_by_fleet_share_without_fabric(self, store, clock):
        """Without a fabric, losing more than the fleet share is a partition; fewer are node_downs."""
        corr = make(None, store, clock, fleet_size=lambda: 20)
        corr.on_changes(opened(*(heartbeat(i, clock) for i in range(5))))
        out = settle(corr, clock)
        assert [i.kind for _, i in out] == ["partition"]
        corr2 = make(
            None, IncidentStore(sqlite3.connect(":memory:", isolation_level=None)), clock, fleet_size=lambda: 100
        )
        corr2.on_changes(opened(*(heartbeat(i, clock) for i in range(5))))
        assert sorted(i.kind for _, i in settle(corr2, clock)) == ["node_down"] * 5

    def test_without_fabric_nics_group_by_node(self, store, clock):
        """Without a fabric NIC conditions stay per NIC (no leaf to blame)."""
        corr = make(None, store, clock)
        corr.on_changes(opened(nic_down(0, 3, clock), nic_down(1, 3, clock)))
        out = settle(corr, clock)
        assert sorted(i.root_cause for _, i in out) == ["node-000/nic-3", "node-001/nic-3"]
        assert {i.kind for _, i in out} == {"nic_fault"}

    def test_failslow_and_host_conditions(self, fabric, store, clock):
        """A fail-slow condition is a straggler on its node; a disk condition is a host_fault."""
        corr = make(fabric, store, clock)
        t = clock.time_ms()
        slow = Condition("failslow", "node-004", "node", "failslow", "node-004", "warning", "investigate", "slow", t, t)
        disk = Condition(
            "host_disk", "node-006", "node", "host", "node-006", "warning", "investigate", "disk full", t, t
        )
        corr.on_changes(opened(slow, disk))
        out = settle(corr, clock)
        assert sorted((i.kind, i.root_cause) for _, i in out) == [("host_fault", "node-006"), ("straggler", "node-004")]
        assert all(i.kind in EVICTABLE_KINDS for _, i in out)

    def test_nothing_opens_before_settle(self, fabric, store, clock):
        """A new condition is not grouped until settle_s has passed, so siblings can join it."""
        corr = make(fabric, store, clock)
        corr.on_changes(opened(nic_down(0, 1, clock)))
        clock.advance(1.0)
        assert corr.tick() == []
        corr.on_changes(opened(nic_down(1, 1, clock)))
        clock.advance(1.0)
        out = corr.tick()
        assert [(i.kind, i.root_cause) for _, i in out] == [("switch_fault", "leaf-b0-r1")]

    def test_blip_shorter_than_settle_opens_nothing(self, fabric, store, clock):
        """A condition resolved before it settled never becomes an incident."""
        corr = make(fabric, store, clock)
        c = nic_down(0, 1, clock)
        corr.on_changes(opened(c))
        clock.advance(0.5)
        corr.on_changes(resolved(clock, c))
        assert settle(corr, clock) == []
        assert store.count() == 0

    def test_flap_within_hold_keeps_the_same_incident(self, fabric, store, clock):
        """A condition that resolves and recurs within resolve_hold_s keeps its incident id."""
        corr = make(fabric, store, clock)
        c = nic_down(2, 4, clock)
        corr.on_changes(opened(c))
        ((_, inc),) = settle(corr, clock)
        corr.on_changes(resolved(clock, c))
        clock.advance(30)
        assert corr.tick() == []
        c2 = nic_down(2, 4, clock)
        corr.on_changes(opened(c2))
        clock.advance(45)
        assert [i.id for i in corr.incidents()] == [inc.id]
        assert corr.tick() == []  # still active: nothing resolves
        corr.on_changes(resolved(clock, c2))
        clock.advance(59)
        assert corr.tick() == []
        clock.advance(1)
        out = corr.tick()
        assert [(ch, i.id) for ch, i in out] == [("resolved", inc.id)]
        assert store.count() == 1

    def test_recurrence_soon_after_resolution_reopens_same_incident(self, fabric, store, clock):
        """A recurrence within resolve_hold_s of the incident resolving reopens it under the same id."""
        corr = make(fabric, store, clock)
        c = nic_down(2, 4, clock)
        corr.on_changes(opened(c))
        ((_, inc),) = settle(corr, clock)
        corr.on_changes(resolved(clock, c))
        clock.advance(60)
        assert [ch for ch, _ in corr.tick()] == ["resolved"]
        clock.advance(10)
        corr.on_changes(opened(nic_down(2, 4, clock)))
        out = settle(corr, clock)
        assert [(ch, i.id, i.active) for ch, i in out] == [("opened", inc.id, True)]
        assert store.count() == 1
        assert [h["change"] for h in store.history(inc.id)] == ["opened", "resolved", "reopened"]

    def test_severity_escalation_updates_incident(self, fabric, store, clock):
        """A member condition escalating from warning to critical updates the incident's severity."""
        corr = make(fabric, store, clock)
        c = nic_down(3, 3, clock, severity="warning")
        corr.on_changes(opened(c))
        ((_, inc),) = settle(corr, clock)
        assert inc.severity == "warning"
        c.severity = "critical"
        corr.on_changes([ConditionChange("updated", c)])
        out = corr.tick()
        assert [(ch, i.id, i.severity) for ch, i in out] == [("updated", inc.id, "critical")]

    def test_incidents_survive_a_restart(self, fabric, clock, tmp_path: Path):
        """A restarted controller resumes open incidents, keeps their id when conditions return, else resolves them."""
        db = tmp_path / "controller.db"
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        corr = make(fabric, IncidentStore(conn), clock)
        corr.on_changes(opened(*(nic_down(i, 3, clock) for i in range(4)), gpu_xid(20, 1, clock)))
        out = settle(corr, clock)
        ids = {i.root_cause: i.id for _, i in out}
        conn.close()

        conn2 = sqlite3.connect(db, isolation_level=None)
        corr2 = make(fabric, IncidentStore(conn2), clock)
        assert {i.root_cause: i.id for i in corr2.incidents()} == ids
        corr2.on_changes(opened(*(nic_down(i, 3, clock) for i in range(4))))  # the engine re-raises the leaf NICs
        clock.advance(corr2.config.restart_grace_s)
        out2 = settle(corr2, clock)
        assert [(ch, i.id) for ch, i in out2] == [("resolved", ids["node-020/gpu-1"])]
        assert [i.id for i in corr2.incidents()] == [ids["leaf-b0-r3"]]

    def test_large_fabric_grouping(self, clock):
        """On a 2,048-node fabric a mixed batch groups into the expected incidents."""
        big = generate_fabric(nodes=2048, rails=8, nodes_per_block=16, spines=8)
        corr = make(big, IncidentStore(sqlite3.connect(":memory:", isolation_level=None)), clock)
        rng = random.Random(7)
        conds: list[Condition] = [nic_down(i, 6, clock, width=4) for i in range(16 * 40, 16 * 41)]  # leaf-b40-r6
        conds += [heartbeat(i, clock, width=4) for i in range(16 * 90, 16 * 90 + 6)]  # block 90 partition
        lone_nodes = rng.sample(range(16 * 100, 2048), 60)  # blocks 100+: one NIC each, distinct leaves
        conds += [nic_down(n, n % 8, clock, width=4) for n in lone_nodes if n % 16 < 8]
        conds += [gpu_xid(n, 2, clock, width=4) for n in rng.sample(range(16 * 50, 16 * 60), 20)]
        corr.on_changes(opened(*conds))
        out = settle(corr, clock)
        kinds = sorted(i.kind for _, i in out)
        lone = sum(1 for n in lone_nodes if n % 16 < 8)
        assert kinds.count("switch_fault") == 1
        assert kinds.count("partition") == 1
        assert kinds.count("gpu_fault") == 20
        assert kinds.count("nic_fault") == lone  # distinct slots below 8 in a block -> distinct rails and leaves
        assert "node_down" not in kinds
        leaf = next(i for _, i in out if i.kind == "switch_fault")
        assert (leaf.root_cause, len(leaf.affected_nodes)) == ("leaf-b40-r6", 16)


class TestDeadLeafUplinks:
    def test_spine_side_ports_of_a_dead_leaf_join_the_leaf_incident(self) -> None:
        """A dead leaf's NICs and its uplinks as the spines see them are one incident, not 1 + 8."""
        from controller.detect.correlate import CorrelationConfig, Grouper
        from controller.detect.model import Condition
        from controller.fabric import generate_fabric

        fabric = generate_fabric(nodes=32, gpus_per_node=8, rails=8, nodes_per_block=16, spines=8)
        conds = [
            Condition(
                "nic.port_down", nic, "nic", "nic_link", fabric.host_of(nic), "critical", "check_link", "down", 0, 0
            )
            for nic in fabric.nics_on_leaf("leaf-b0-r3")
        ]
        for spine in fabric.spines_of("leaf-b0-r3"):
            cable = fabric.link_name("leaf-b0-r3", spine)
            conds.append(
                Condition(
                    "switch.port_down", cable, "link", "switch_port", None, "critical", "check_link", "down", 0, 0
                )
            )
        groups = Grouper(fabric, CorrelationConfig(), lambda: 32).group(conds)
        assert len(groups) == 1
        assert groups[0].kind == "switch_fault" and groups[0].root_cause == "leaf-b0-r3"


class TestExplainedStragglers:
    def test_a_node_slow_because_of_its_nic_fault_is_not_a_second_incident(self) -> None:
        """Fail-slow on a node with a NIC fault joins the NIC incident instead of opening a straggler."""
        from controller.detect.correlate import CorrelationConfig, Grouper
        from controller.detect.model import Condition
        from controller.fabric import generate_fabric

        fabric = generate_fabric(nodes=8, gpus_per_node=8, rails=4, nodes_per_block=4, spines=2)
        nic = Condition(
            "nic.pfc_pause_storm",
            "node-006/nic-1",
            "nic",
            "nic_errors",
            "node-006",
            "warning",
            "check_pfc",
            "storm",
            0,
            0,
        )
        slow = Condition("failslow", "node-006", "node", "failslow", "node-006", "warning", "investigate", "slow", 0, 0)
        other = Condition(
            "failslow", "node-002", "node", "failslow", "node-002", "warning", "investigate", "slow", 0, 0
        )
        groups = {g.kind: g for g in Grouper(fabric, CorrelationConfig(), lambda: 8).group([nic, slow, other])}
        assert set(groups) == {"nic_fault", "straggler"}
        assert slow.key in groups["nic_fault"].members
        assert groups["straggler"].root_cause == "node-002"
