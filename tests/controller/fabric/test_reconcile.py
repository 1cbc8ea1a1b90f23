"""Reconciling the declared fabric with LLDP from hosts and switches."""

from __future__ import annotations

from typing import Any

import pytest

from controller.fabric import Fabric, generate_fabric, reconcile
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb


@pytest.fixture
def fabric() -> Fabric:
    return generate_fabric(32, gpus_per_node=8, rails=8, nodes_per_block=16, spines=2)


def host_view(node: str, slot: int, block: int = 0, rails: int = 8) -> list[tuple[str, str, str]]:
    """What a correctly cabled node's agent reports."""
    return [(f"{node}/nic-{r}", f"leaf-b{block}-r{r}", f"Ethernet{4 * slot}") for r in range(rails)]


class TestReconcile:
    def test_clean_fabric_is_ok(self, fabric):
        """Correct LLDP from hosts gives no findings and one learned edge per NIC."""
        report = reconcile(fabric, {"node-003": host_view("node-003", 3), "node-020": host_view("node-020", 4, 1)})
        assert report.ok
        assert report.messages() == []
        assert len(report.learned) == 16
        assert {e.kind for e in report.learned} == {"nic-leaf"}

    def test_miswired_nic_message(self, fabric):
        """A NIC on the wrong rail leaf gives the exact human message."""
        view = host_view("node-007", 7)
        view[3] = ("node-007/nic-3", "leaf-b0-r4", "Ethernet28")
        report = reconcile(fabric, {"node-007": view})
        assert [m.message for m in report.miswired] == ["node-007/nic-3 expected on leaf-b0-r3, seen on leaf-b0-r4"]
        m = report.miswired[0]
        assert (m.component, m.expected, m.seen, m.seen_port) == (
            "node-007/nic-3",
            "leaf-b0-r3",
            "leaf-b0-r4",
            "Ethernet28",
        )
        assert report.missing == []
        assert not report.ok

    def test_wrong_port_on_right_leaf(self, fabric):
        """The right leaf at the wrong port is a miswire only when ports are checked."""
        view = host_view("node-002", 2)
        view[0] = ("node-002/nic-0", "leaf-b0-r0", "Ethernet60")
        report = reconcile(fabric, {"node-002": view})
        assert report.messages() == [
            "node-002/nic-0 expected on leaf-b0-r0 port Ethernet8, seen on leaf-b0-r0 port Ethernet60"
        ]
        assert reconcile(fabric, {"node-002": view}, check_ports=False).ok

    def test_unknown_devices(self, fabric):
        """Neighbour names and reporters not in the fabric are unknown devices."""
        view = host_view("node-001", 1)
        view[6] = ("node-001/nic-6", "mgmt-sw-17", "Gi1/0/3")
        report = reconcile(fabric, {"node-001": view, "rogue-host": []})
        assert [(u.name, u.seen_by, u.local) for u in report.unknown] == [
            ("mgmt-sw-17", "node-001", "node-001/nic-6"),
            ("rogue-host", "controller", ""),
        ]
        assert "unknown device 'mgmt-sw-17' seen by node-001 node-001/nic-6" in report.messages()

    def test_missing_links_only_for_reporting_nodes(self, fabric):
        """NICs of a node that reported LLDP but not on them are missing; silent nodes are not."""
        report = reconcile(fabric, {"node-005": host_view("node-005", 5)[:6], "node-006": []})
        assert [m.message for m in report.missing] == [
            "node-005/nic-6 expected on leaf-b0-r6 port Ethernet20, not seen",
            "node-005/nic-7 expected on leaf-b0-r7 port Ethernet20, not seen",
        ]

    def test_interface_mapping(self, fabric):
        """Raw interface names resolve through nic_of_interface; short "nic-N" names work too."""
        observed = {
            "node-004": [("ens1f0np0", "leaf-b0-r0", "Ethernet16"), ("nic-1", "leaf-b0-r1", "Ethernet16")],
        }
        mapping = {"node-004": {"ens1f0np0": "node-004/nic-0"}}
        report = reconcile(fabric, observed, nic_of_interface=mapping)
        assert [(e.a, e.b) for e in report.learned] == [
            ("node-004/nic-0", "leaf-b0-r0"),
            ("node-004/nic-1", "leaf-b0-r1"),
        ]
        unmapped = reconcile(fabric, {"node-004": [("eth9", "leaf-b0-r0", "Ethernet16")]})
        assert unmapped.unresolved == ["node-004 eth9"]

    def test_accepts_lldp_protos(self, fabric):
        """LldpNeighbor messages from agent reports are accepted as observations."""
        n = ipb.LldpNeighbor(local_interface="nic-2", chassis_name="leaf-b0-r5", port_id="Ethernet0")
        report = reconcile(fabric, {"node-000": [n]})
        assert report.miswired[0].message == "node-000/nic-2 expected on leaf-b0-r2, seen on leaf-b0-r5"

    def test_switch_side_observations(self, fabric):
        """Switch LLDP finds a miswired host NIC and a miswired uplink, and confirms good ones."""
        switches = {
            "leaf-b0-r4": [("Ethernet36", "node-009", "nic-3"), ("Ethernet0", "node-000", "nic-4")],
            "leaf-b0-r0": [("Ethernet64", "spine-1", "Ethernet0"), ("Ethernet68", "spine-0", "Ethernet0")],
        }
        report = reconcile(fabric, {}, switches=switches)
        msgs = report.messages()
        assert "node-009/nic-3 expected on leaf-b0-r3, seen on leaf-b0-r4" in msgs
        assert "leaf-b0-r0 Ethernet64 expected on spine-0, seen on spine-1" in msgs
        assert "leaf-b0-r0 Ethernet68 expected on spine-1, seen on spine-0" in msgs
        assert "node-000/nic-4" not in " ".join(msgs)
        # leaf-b0-r4 reported: of its 16 declared cables only node-000/nic-4 was seen.
        assert sum(1 for m in report.missing if m.b == "leaf-b0-r4") == 15
        assert "node-009/nic-4 expected on leaf-b0-r4 port Ethernet36, not seen" in msgs

    def test_host_and_switch_views_deduplicate(self, fabric):
        """The same miswired cable seen from both ends is one miswire."""
        view = host_view("node-009", 9)
        view[3] = ("node-009/nic-3", "leaf-b0-r4", "Ethernet36")
        report = reconcile(fabric, {"node-009": view}, switches={"leaf-b0-r4": [("Ethernet36", "node-009", "nic-3")]})
        assert [m.component for m in report.miswired] == ["node-009/nic-3"]


class TestApplyLearned:
    def test_learned_wiring_becomes_truth(self, fabric):
        """After apply_learned, each NIC's leaf is the one LLDP saw, so root cause follows the real cable."""
        view = host_view("node-007", 7)
        view[3] = ("node-007/nic-3", "leaf-b0-r4", "Ethernet28")  # nic-3 and nic-4 swapped
        view[4] = ("node-007/nic-4", "leaf-b0-r3", "Ethernet28")
        report = reconcile(fabric, {"node-007": view})
        assert len(report.miswired) == 2
        changes = fabric.apply_learned(report)
        assert [(c.a, c.old_peer, c.new_peer, c.port) for c in changes] == [
            ("node-007/nic-3", "leaf-b0-r3", "leaf-b0-r4", "Ethernet28"),
            ("node-007/nic-4", None, "leaf-b0-r3", "Ethernet28"),
        ]
        assert fabric.leaf_of("node-007/nic-3") == "leaf-b0-r4"
        assert fabric.leaf_of("node-007/nic-4") == "leaf-b0-r3"
        assert fabric.nics_on_leaf("leaf-b0-r3").count("node-007/nic-4") == 1
        assert fabric.peer_at("leaf-b0-r4", "Ethernet28") == "node-007/nic-3"
        assert fabric.graph.edges["node-007/nic-3", "leaf-b0-r4"]["learned"] is True
        assert reconcile(fabric, {"node-007": view}).ok

    def test_learned_cable_evicts_declared_occupant(self, fabric):
        """A NIC learned on a port declared for another NIC takes the port; the other is uncabled."""
        report = reconcile(fabric, {"node-007": [("node-007/nic-3", "leaf-b0-r4", "Ethernet28")]})
        fabric.apply_learned(report)
        assert fabric.leaf_of("node-007/nic-3") == "leaf-b0-r4"
        assert fabric.leaf_of("node-007/nic-4") is None
        assert "node-007" in fabric.nodes_behind("leaf-b0-r4")
        assert "node-007" not in fabric.nodes_behind("leaf-b0-r3")

    def test_apply_is_idempotent(self, fabric):
        """Applying a clean or already-applied report changes nothing."""
        report = reconcile(fabric, {"node-003": host_view("node-003", 3)})
        assert fabric.apply_learned(report) == []
        assert fabric.apply_learned(report.learned) == []

    def test_uplink_rewired(self, fabric):
        """A learned leaf-spine cable replaces the declared one at that leaf port."""
        report = reconcile(fabric, {}, switches={"leaf-b0-r0": [("Ethernet64", "spine-1", "Ethernet0")]})
        fabric.apply_learned(report)
        assert fabric.peer_at("leaf-b0-r0", "Ethernet64") == "spine-1"
        assert fabric.spines_of("leaf-b0-r0") == ["spine-1"]
        assert "leaf-b0-r0" not in fabric.leaves_of("spine-0")


class TestTransitions:
    def test_nic_seen_on_two_ports_is_reported_but_not_learned(self, fabric):
        """Right after a re-cabling lldpd still lists the old neighbour: adopting both ends would uncable a NIC."""
        view = host_view("node-007", 7)
        view.append(("node-007/nic-3", "leaf-b0-r4", "Ethernet28"))  # new far end; the old one not aged out yet
        view.append(("node-007/nic-4", "leaf-b0-r3", "Ethernet28"))
        report = reconcile(fabric, {"node-007": view})
        assert sorted(m.component for m in report.miswired) == ["node-007/nic-3", "node-007/nic-4"]
        assert not [e for e in report.learned if e.a in ("node-007/nic-3", "node-007/nic-4")]
        assert fabric.apply_learned(report) == []
        assert fabric.leaf_of("node-007/nic-3") == "leaf-b0-r3" and fabric.leaf_of("node-007/nic-4") == "leaf-b0-r4"


def _record(node: str, view: list[tuple[str, str, str]]) -> Any:
    from controller.ingest.registry import NodeRecord

    lldp = [ipb.LldpNeighbor(local_interface=i.rsplit("/", 1)[-1], chassis_name=n, port_id=p) for i, n, p in view]
    return NodeRecord(node, ipb.NODE_ROLE_COMPUTE, "online", 0, 0, lldp=lldp)


class TestTracker:
    def test_miswire_reported_while_it_lasts_and_the_fabric_follows_both_ways(self, fabric):
        from controller.fabric.topology import TopologyTracker

        tracker = TopologyTracker(fabric, min_interval_s=0, clock=FakeClock())
        good = host_view("node-007", 7)
        swapped = list(good)
        swapped[3] = ("node-007/nic-3", "leaf-b0-r4", "Ethernet28")
        swapped[4] = ("node-007/nic-4", "leaf-b0-r3", "Ethernet28")
        expected = [
            "node-007/nic-3 expected on leaf-b0-r3, seen on leaf-b0-r4",
            "node-007/nic-4 expected on leaf-b0-r4, seen on leaf-b0-r3",
        ]
        for _ in range(2):  # a second reconcile, after the rewire, still compares with the declaration
            tracker.update(_record("node-007", swapped))
            report = tracker.tick()
            assert report is not None and sorted(m.message for m in report.miswired) == expected
            assert fabric.leaf_of("node-007/nic-3") == "leaf-b0-r4"  # root cause follows the real cable
        tracker.update(_record("node-007", good))
        report = tracker.tick()
        assert report is not None and report.ok
        assert fabric.leaf_of("node-007/nic-3") == "leaf-b0-r3" and fabric.leaf_of("node-007/nic-4") == "leaf-b0-r4"
        assert tracker.declared is not None and tracker.declared.leaf_of("node-007/nic-3") == "leaf-b0-r3"
