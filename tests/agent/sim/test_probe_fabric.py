"""The simulated data plane's faults as the fault table places them, and the drawn prober's windows."""

from __future__ import annotations

import pytest

from agent.sim.fault_kinds import UnknownFault
from agent.sim.faults import FAULTS
from agent.sim.probe_fabric import DataPlaneOnly, DrawnProber, PlacedFault, SimProbeFabric, component
from controller.fabric import generate_fabric
from starpulse.v1 import service_pb2 as spb

FABRIC = generate_fabric(8, gpus_per_node=4, rails=4, nodes_per_block=4, spines=2)


def plan(version: int = 1, *, paused: bool = False) -> spb.ProbePlan:
    """node-000's NIC 0 probing node-004's NIC 0 (the other block: the path crosses a spine) on two flows."""
    target = spb.ProbeTarget(
        local_nic="node-000/nic-0", peer_nic="node-004/nic-0", src_ports=[40001, 40002], packets_per_s=20.0
    )
    return spb.ProbePlan(version=version, window_s=10, targets=[target], paused=paused)


def test_a_target_names_the_component_the_data_plane_holds() -> None:
    assert component("leaf-b0-r1") == "leaf-b0-r1"
    assert component("spine-1<->leaf-b0-r1") == component("leaf-b0-r1<->spine-1") == "leaf-b0-r1<->spine-1"
    assert component("leaf-b0-r1<->node-001/nic-1") == "node-001/nic-1"  # a NIC's cable is the NIC's


def test_the_drawn_prober_hands_each_closed_window_once_and_only_for_its_plan() -> None:
    now = [100.0]
    plane = SimProbeFabric(FABRIC.leaf_of, FABRIC.spines_of)
    prober = DrawnProber(plane, seed=1, now=lambda: now[0])
    assert prober.take_results() == []  # no plan: nothing to probe
    prober.apply(plan(2))
    now[0] += 9.9
    assert prober.take_results() == []  # the first window has not closed
    now[0] += 10.2  # two windows closed (at 10 s and 20 s)
    results = prober.take_results()
    assert sum(r.sent for r in results) == 2 * 10 * 20 and all(r.lost == 0 for r in results)
    assert {r.plan_version for r in results} == {2} and prober.take_results() == []
    prober.apply(plan(1))  # an older plan is ignored
    assert prober.plan.version == 2
    prober.apply(plan(3, paused=True))
    now[0] += 30
    assert prober.take_results() == []  # paused: nothing sent


def test_a_lossy_spine_loses_only_the_flows_ecmp_puts_on_it() -> None:
    now = [0.0]
    plane = SimProbeFabric(FABRIC.leaf_of, FABRIC.spines_of)
    spines = {p: plane.path("node-000/nic-0", "node-004/nic-0", p)[1] for p in (40001, 40002)}
    lossy = spines[40001]
    surface = DataPlaneOnly(plane)
    FAULTS["switch_silent_drop"].inject(surface, PlacedFault(lossy, {"loss": 0.3}))
    prober = DrawnProber(plane, seed=3, now=lambda: now[0])
    prober.apply(plan())
    now[0] += 10
    results = prober.take_results()
    lossy_ports = {r.src_port for r in results if r.lost}
    assert lossy_ports == {p for p, spine in spines.items() if spine == lossy}  # reported alone, by port
    assert all(r.via == lossy for r in results if r.lost)  # with the spine it crossed
    FAULTS["switch_silent_drop"].clear(surface, PlacedFault(lossy, {"loss": 0.3}))
    assert plane.loss == {}


def test_a_data_plane_alone_refuses_a_kind_that_needs_the_cluster() -> None:
    with pytest.raises(UnknownFault, match="only the probe mesh's fault kinds"):
        FAULTS["switch_down"].inject(DataPlaneOnly(SimProbeFabric(FABRIC.leaf_of, FABRIC.spines_of)), PlacedFault("x"))
