"""The simulated data plane's faults as the fault table places them, the drawn prober's windows,
and its clean shortcut: with no fault anywhere it skips working out each flow's path, and draws
exactly what the long way draws (the same results, the same random draws)."""

from __future__ import annotations

import random

import pytest

from agent.sim.fault_kinds import UnknownFault
from agent.sim.faults import FAULTS
from agent.sim.probe_fabric import DataPlaneOnly, DrawnProber, PlacedFault, SimProbeFabric, component
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
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


def test_a_clean_window_is_what_the_long_way_gives() -> None:
    fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True)
    mesh = plan_mesh(fabric, config, version=1)
    short = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
    long = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
    long.inject_loss("a component no path crosses", 0.0)  # a fault entry: the long way, losing nothing
    rng_short, rng_long = random.Random(5), random.Random(5)
    for node in sorted(fabric.nodes())[:6]:
        plan = mesh.for_node(node, config)
        got = short.window_results(plan, rng_short)
        want = long.window_results(plan, rng_long)
        assert got and [r.SerializeToString() for r in got] == [r.SerializeToString() for r in want]
        assert all(r.lost == 0 and not r.via and not r.src_port for r in got)
    assert rng_short.random() == rng_long.random()  # as many draws each way


def test_a_fault_takes_the_long_way_and_loses() -> None:
    fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True)
    plan = plan_mesh(fabric, config, version=1).for_node("node-000", config)
    sim = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
    sim.inject_loss("node-000/nic-0", 0.5)
    results = sim.window_results(plan, random.Random(1))
    assert sum(r.lost for r in results if r.local_nic == "node-000/nic-0") > 0
    assert all(r.lost == 0 for r in results if "node-000/nic-0" not in (r.local_nic, r.peer_nic))
