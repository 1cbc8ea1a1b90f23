"""SimCluster against a real in-process controller: registration, LLDP, switch ports, and what each fault shows.

One small fabric (4 nodes in one block, 8 rails, 2 spines: 4 compute + 10 switch agents).
Each test asserts on what the controller *received*, not on the simulator's state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controller.fabric import generate_fabric
from controller.ingest.registry import ONLINE, UNREACHABLE, NodeRecord
from controller.ingest.verdict import ReportResult
from controller.service import Controller, ControllerConfig
from starpulse.app.scenario.cluster import SimCluster, render_lldpcli_json
from starpulse.app.scenario.spec import FaultSpec
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.findings import event_kind_name
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, wait_for

HEARTBEAT_S = 3.0
INTERVAL_S = 0.5


@dataclass
class Seen:
    """Registry listener: every event the controller stored, as (node, kind, component)."""

    events: list[tuple[str, str, str]] = field(default_factory=list)

    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        return None

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        self.events.extend((node.node_id, event_kind_name(e.kind), e.component) for e in events)

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        return None

    def count(self, node: str, kind: str) -> int:
        return sum(1 for n, k, _ in self.events if n == node and k == kind)


@dataclass
class Rig:
    controller: Controller
    cluster: SimCluster
    seen: Seen

    def node(self, name: str) -> NodeRecord | None:
        return self.controller.registry.nodes.get(name)

    def state(self, name: str) -> str:
        rec = self.node(name)
        return rec.state if rec else "absent"

    def port(self, switch: str, port: str) -> tpb.SwitchPortSample | None:
        rec = self.node(switch)
        if rec is None or rec.latest_report is None:
            return None
        return next((p for p in rec.latest_report.switch_ports if p.port == port), None)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    controller = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            heartbeat_timeout_s=HEARTBEAT_S,
            sweep_interval_s=0.2,
        ),
        clock=SYSTEM_CLOCK,
    )
    seen = Seen()
    controller.registry.listeners.append(seen)
    await controller.start()
    fabric = generate_fabric(nodes=4, gpus_per_node=8, rails=8, nodes_per_block=4, spines=2)
    cluster = SimCluster(fabric, tmp_path, f"127.0.0.1:{controller.grpc_port}", INTERVAL_S)
    await cluster.start()
    r = Rig(controller, cluster, seen)
    try:
        await wait_for(
            lambda: all(r.node(n) is not None and r.node(n).latest_report is not None for n in cluster.agents),  # type: ignore[union-attr]
            timeout=30,
            what="every agent registered and reported",
        )
        yield r
    finally:
        await cluster.stop()
        await cluster.stop()  # idempotent
        await controller.stop()
    assert not (tmp_path / "simcluster").exists()


def lldp_of(rec: NodeRecord) -> dict[str, tuple[str, str]]:
    return {n.local_interface: (n.chassis_name, n.port_id) for n in rec.lldp}


async def test_agents_register_with_lldp_and_switch_ports(rig: Rig) -> None:
    fabric, cluster = rig.cluster.fabric, rig.cluster
    roles = {n: rec.role for n, rec in rig.controller.registry.nodes.items()}
    assert {n for n, r in roles.items() if r == ipb.NODE_ROLE_COMPUTE} == set(fabric.nodes())
    assert {n for n, r in roles.items() if r == ipb.NODE_ROLE_SWITCH} == set(fabric.switches())
    assert len(cluster.agents) == 14 and set(cluster.switches) == set(fabric.switches())

    # Compute LLDP: every rail netdev sees its leaf, on the port the fabric declares.
    for node in fabric.nodes():
        rec = rig.node(node)
        assert rec is not None
        netdevs = cluster.sims[node].sysfs.netdevs()
        expected = {
            netdevs[fabric.rail_of(nic)]: (fabric.leaf_of(nic), fabric.port_of(nic)) for nic in fabric.nics_of(node)
        }
        assert lldp_of(rec) == expected

    # Switch reports carry every port; the leaf's LLDP names hosts by NIC netdev, and spines by port.
    leaf = rig.node("leaf-b0-r2")
    assert leaf is not None and leaf.latest_report is not None
    assert [p.port for p in leaf.latest_report.switch_ports] == [f"Ethernet{4 * i}" for i in range(6)]
    assert all(p.oper_status == "up" for p in leaf.latest_report.switch_ports)
    netdev = cluster.sims["node-001"].sysfs.netdevs()[2]
    leaf_lldp = lldp_of(leaf)
    assert leaf_lldp["Ethernet4"] == ("node-001", netdev)
    assert leaf_lldp["Ethernet16"] == ("spine-0", "Ethernet8")
    spine = rig.node("spine-1")
    assert spine is not None and spine.latest_report is not None
    assert len(spine.latest_report.switch_ports) == 8
    assert lldp_of(spine)["Ethernet12"] == ("leaf-b0-r3", "Ethernet20")
    assert cluster.jobs_of("node-000") == []


def test_render_lldpcli_json_round_trips() -> None:
    from agent.collectors.lldp import parse_lldpcli_json

    triples = [("eth2", "leaf-b0-r2", "Ethernet4"), ("eth3", "leaf-b0-r3", "Ethernet4")]
    got = parse_lldpcli_json(render_lldpcli_json(triples))
    assert [(n.local_interface, n.chassis_name, n.port_id) for n in got] == [
        ("eth2", "leaf-b0-r2", "Ethernet4"),
        ("eth3", "leaf-b0-r3", "Ethernet4"),
    ]
    assert parse_lldpcli_json(render_lldpcli_json([])) == []


async def test_node_and_port_faults(rig: Rig) -> None:
    cluster, seen = rig.cluster, rig.seen
    xid = FaultSpec(at_s=0, kind="gpu_xid", target="node-000/gpu-2", params={"xid": 79})
    nic_down = FaultSpec(at_s=0, kind="nic_down", target="node-001/nic-3")
    storm = FaultSpec(at_s=0, kind="pfc_storm", target="leaf-b0-r5:port-2", params={"queue": 3})
    optics = FaultSpec(at_s=0, kind="optics_degraded", target="node-003/nic-6")
    uplink = FaultSpec(at_s=0, kind="switch_port_down", target="leaf-b0-r7<->spine-1")
    for f in (xid, nic_down, storm, optics, uplink):
        cluster.inject(f)

    await wait_for(lambda: seen.count("node-000", "xid") >= 1, what="xid event from node-000")
    await wait_for(lambda: seen.count("node-001", "nic_link_down") >= 1, what="nic_link_down from node-001")
    # nic_down: the leaf sees its port go down and the node's LLDP loses that neighbour
    await wait_for(lambda: seen.count("leaf-b0-r3", "switch_port_down") >= 1, what="leaf-b0-r3 port down")
    assert ("leaf-b0-r3", "switch_port_down", "Ethernet4") in seen.events
    netdev = cluster.sims["node-001"].sysfs.netdevs()[3]
    await wait_for(lambda: netdev not in lldp_of(rig.node("node-001")), what="LLDP neighbour gone")  # type: ignore[arg-type]
    # switch port storm and optics
    await wait_for(lambda: seen.count("leaf-b0-r5", "pfc_storm") >= 1, what="PFC watchdog storm on leaf-b0-r5")
    await wait_for(
        lambda: (
            (p := rig.port("leaf-b0-r6", "Ethernet12")) is not None
            and len(p.optic_rx_power_dbm) > 0
            and min(p.optic_rx_power_dbm) < -10
        ),
        what="low rx power on leaf-b0-r6 Ethernet12",
    )
    # a leaf-spine cable: both ends down
    await wait_for(
        lambda: (
            ("leaf-b0-r7", "switch_port_down", "Ethernet20") in seen.events
            and ("spine-1", "switch_port_down", "Ethernet28") in seen.events
        ),
        what="uplink down at both ends",
    )

    for f in (nic_down, uplink, storm):
        cluster.clear(f)
    await wait_for(lambda: seen.count("node-001", "nic_link_up") >= 1, what="nic_link_up after clear")
    await wait_for(lambda: netdev in lldp_of(rig.node("node-001")), what="LLDP neighbour back")  # type: ignore[arg-type]
    await wait_for(lambda: seen.count("spine-1", "switch_port_up") >= 1, what="spine port up after clear")
    assert all(rig.state(n) == ONLINE for n in cluster.agents)


async def test_switch_down_partition_node_down(rig: Rig) -> None:
    cluster, seen, fabric = rig.cluster, rig.seen, rig.cluster.fabric
    leaf_down = FaultSpec(at_s=0, kind="switch_down", target="leaf-b0-r4")
    spine_down = FaultSpec(at_s=0, kind="switch_down", target="spine-0")
    partition = FaultSpec(at_s=0, kind="partition", targets=["node-002"])
    node_down = FaultSpec(at_s=0, kind="node_down", target="node-003")
    nic_on_dead_leaf = FaultSpec(at_s=0, kind="nic_down", target="node-000/nic-4")  # overlaps the leaf
    for f in (leaf_down, spine_down, partition, node_down, nic_on_dead_leaf):
        cluster.inject(f)

    # Every node (but the ones cut off from the controller) reports its NIC on the dead leaf down.
    for nic in fabric.nics_on_leaf("leaf-b0-r4"):
        host = fabric.host_of(nic)
        if host in ("node-002", "node-003"):
            continue
        await wait_for(lambda h=host: seen.count(h, "nic_link_down") >= 1, what=f"nic_link_down from {host}")
    # Every leaf reports its uplink to the dead spine down (port nodes_per_block + 0).
    for leaf in fabric.leaves():
        if leaf == "leaf-b0-r4":
            continue
        await wait_for(
            lambda lf=leaf: (lf, "switch_port_down", "Ethernet16") in seen.events, what=f"{leaf} uplink down"
        )
    silent = ["leaf-b0-r4", "spine-0", "node-002", "node-003"]
    await wait_for(
        lambda: all(rig.state(n) == UNREACHABLE for n in silent), timeout=HEARTBEAT_S + 10, what="silent agents"
    )
    assert not cluster.running("node-003") and cluster.running("node-002")
    assert all(rig.state(n) == ONLINE for n in cluster.agents if n not in silent)

    before = seen.count("node-000", "nic_link_up")
    for f in (leaf_down, spine_down, partition, node_down):
        cluster.clear(f)
    await wait_for(lambda: all(rig.state(n) == ONLINE for n in silent), timeout=20, what="silent agents back")
    await wait_for(lambda: cluster.running("node-003"), what="node-003 agent restarted")
    await wait_for(lambda: seen.count("node-001", "nic_link_up") >= 1, what="node-001 NIC up after leaf returns")
    # node-000/nic-4 is still held down by its own fault: the leaf coming back must not raise it
    assert seen.count("node-000", "nic_link_up") == before
    assert cluster.sims["node-000"].sysfs.netdevs()[4] not in lldp_of(rig.node("node-000"))  # type: ignore[arg-type]
    cluster.clear(nic_on_dead_leaf)
    await wait_for(lambda: seen.count("node-000", "nic_link_up") > before, what="node-000 NIC up after its clear")
