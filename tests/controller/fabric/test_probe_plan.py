"""The probe planner on generated fabrics: every leaf-spine link covered, the budget kept."""

from __future__ import annotations

import zlib

import pytest

from controller.fabric import generate_fabric
from controller.fabric.model import Fabric
from controller.fabric.probeplan import MeshPlan, ProbeConfig, flows_for, plan_mesh


def _ecmp(fabric: Fabric, leaf: str, key: str) -> str:
    """A stand-in for a switch's ECMP hash: the spine a flow leaves ``leaf`` by."""
    spines = sorted(fabric.spines_of(leaf))
    return spines[zlib.crc32(f"{leaf}|{key}".encode()) % len(spines)]


def _links_covered(fabric: Fabric, plan: MeshPlan) -> dict[tuple[str, str], int]:
    """Flows per (leaf, spine) cable, requests and replies hashed on their own 5-tuples."""
    seen: dict[tuple[str, str], int] = {}
    for targets in plan.targets.values():
        for t in targets:
            a, b = fabric.leaf_of(t.local_nic), fabric.leaf_of(t.peer_nic)
            assert a is not None and b is not None
            if a == b:
                continue
            src, dst = plan.addresses[t.local_nic], plan.addresses[t.peer_nic]
            for port in t.src_ports:
                up = _ecmp(fabric, a, f"{src}:{port}>{dst}")  # the request leaves a, enters b
                back = _ecmp(fabric, b, f"{dst}>{src}:{port}")  # the reply leaves b, enters a
                for cable in ((a, up), (b, up), (b, back), (a, back)):
                    seen[cable] = seen.get(cable, 0) + 1
    return seen


@pytest.mark.parametrize(("nodes", "per_block"), [(16, 16), (64, 16), (256, 32), (2048, 32), (40, 6)])
def test_every_leaf_spine_link_is_covered_and_the_budget_kept(nodes: int, per_block: int) -> None:
    fabric = generate_fabric(nodes, nodes_per_block=per_block, spines=8)
    config = ProbeConfig(enabled=True)
    plan = plan_mesh(fabric, config)

    covered = _links_covered(fabric, plan)
    missing = [(leaf, s) for leaf in fabric.leaves() for s in fabric.spines_of(leaf) if covered.get((leaf, s), 0) == 0]
    assert missing == []
    budget = config.packets_per_s_per_nic
    assert max(plan.sent_pps().values()) <= budget + 1e-9
    assert max(plan.received_pps().values()) <= budget + 1e-9
    # every NIC probes and is probed: no blind spot at the edge either
    assert set(plan.sent_pps()) == set(fabric.nics())
    assert set(plan.received_pps()) == set(fabric.nics())


def test_one_block_relies_on_hostping_across_rails() -> None:
    fabric = generate_fabric(16, nodes_per_block=16, spines=4)
    plan = plan_mesh(fabric, ProbeConfig(enabled=True))
    purposes = {t.purpose for ts in plan.targets.values() for t in ts}
    assert purposes == {"hostping", "leaf"}  # no other block to pair with
    hop = next(t for t in plan.targets["node-000"] if t.purpose == "hostping")
    assert fabric.rail_of(hop.local_nic) != fabric.rail_of(hop.peer_nic)
    assert fabric.host_of(hop.peer_nic) == "node-000"


def test_a_leaf_with_two_nics_gets_no_ring_and_an_extra_cross_target() -> None:
    fabric = generate_fabric(6, nodes_per_block=2, spines=2, rails=2)
    plan = plan_mesh(fabric, ProbeConfig(enabled=True, cross_targets=1))
    by_nic: dict[str, list[str]] = {}
    for ts in plan.targets.values():
        for t in ts:
            by_nic.setdefault(t.local_nic, []).append(t.purpose)
    assert "leaf" not in {p for ps in by_nic.values() for p in ps}
    assert sorted(by_nic["node-000/nic-0"]) == ["cross", "cross", "hostping"]


def test_idle_only_pauses_a_jobs_nodes_and_thin_quarters_them() -> None:
    fabric = generate_fabric(32, nodes_per_block=16, spines=4)
    busy = {"node-003", "node-020"}
    idle = plan_mesh(fabric, ProbeConfig(enabled=True, where="idle_only"), busy=busy.__contains__)
    assert idle.paused == busy
    assert not idle.targets.get("node-003")
    assert all(fabric.host_of(t.peer_nic) not in busy for ts in idle.targets.values() for t in ts)
    assert idle.for_node("node-003", ProbeConfig()).paused

    thin = plan_mesh(fabric, ProbeConfig(enabled=True, where="thin_on_jobs"), busy=busy.__contains__)
    sent = thin.sent_pps()
    assert sent["node-003/nic-0"] == pytest.approx(sent["node-004/nic-0"] / 4)


def test_absent_nodes_are_left_out_and_the_pushed_plan_carries_addresses() -> None:
    fabric = generate_fabric(32, nodes_per_block=16, spines=4)
    online = [n for n in fabric.nodes() if n != "node-005"]
    plan = plan_mesh(fabric, ProbeConfig(enabled=True), nodes=online, version=7)
    assert "node-005" not in plan.targets
    assert all(fabric.host_of(t.peer_nic) != "node-005" for ts in plan.targets.values() for t in ts)
    wire = plan.for_node("node-001", ProbeConfig(port=9999))
    assert wire.version == 7 and wire.port == 9999 and wire.payload_bytes == 4200 - 28
    assert wire.listen["node-001/nic-2"] == "10.2.0.1"
    t = wire.targets[0]
    assert t.local_address == wire.listen[t.local_nic]
    assert len(set(t.src_ports)) == len(t.src_ports) == flows_for(4, 0.9)


def test_ecmp_sizing_follows_the_coverage_probability() -> None:
    assert flows_for(1, 0.9) == 1
    assert flows_for(2, 0.9) == 5  # 1 - 2 * 0.5**5 = 0.9375
    assert flows_for(8, 0.9) > flows_for(4, 0.9) > 4
    assert flows_for(64, 0.99) == 64  # capped
