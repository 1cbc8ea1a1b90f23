"""The simulated data plane's clean shortcut: with no fault anywhere it skips working out each
flow's path, and draws exactly what the long way draws (the same results, the same random draws)."""

from __future__ import annotations

import random

from agent.sim.probe_fabric import SimProbeFabric
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh


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
