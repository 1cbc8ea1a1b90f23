"""The localiser's running sums give what one pass over the whole window gave: the same blames
and the same per-component health, through faults that come and go, hosts that stop counting,
results that age out and a wiring change (checked against the pass-over-everything oracle)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.probes import Blame, ProbeLocaliser, ProbeObs, observations
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.probe_reference import ReferenceLocaliser


def _blames(blames: list[Blame]) -> list[tuple[Any, ...]]:
    return [
        (b.component, b.kind, b.what, b.votes, b.sent, b.lost, sorted(tuple(sorted(p.items())) for p in b.pairs))
        for b in blames
    ]


def _faults(fabric: Any, rng: random.Random) -> list[tuple[str, str, float]]:
    """A few faults of every kind the data plane can have, drawn."""
    leaf = rng.choice(sorted(fabric.leaves()))
    spine = rng.choice(sorted(fabric.spines_of(leaf)))
    nic = rng.choice(sorted(fabric.nics()))
    node = rng.choice(sorted(fabric.nodes()))
    return [
        ("loss", leaf, rng.choice([0.01, 0.02, 0.05])),
        ("loss", f"{leaf}<->{spine}", 0.03),
        ("loss", nic, 0.02),
        ("delay", node, 0.002),
        ("delay", f"{leaf}<->{spine}", 0.002),
    ]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("traced", [True, False])
def test_running_sums_match_one_pass_over_the_window(seed: int, traced: bool) -> None:
    rng = random.Random(seed)
    fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True, window_s=5, replan_min_s=0)
    plans = {n: plan_mesh(fabric, config, version=1).for_node(n, config) for n in fabric.nodes()}
    clock = FakeClock()
    down: set[str] = set()

    def node_ok(node: str, since_ms: int) -> bool:
        return node not in down

    new = ProbeLocaliser(fabric, config, clock=clock, node_ok=node_ok)
    old = ReferenceLocaliser(fabric, config, clock=clock, node_ok=node_ok)
    sim = SimProbeFabric(fabric.leaf_of, fabric.spines_of, traced=traced)
    faults = _faults(fabric, rng)
    named = 0
    for step in range(30):
        clock.advance(5.0)
        if step % 6 == 0:  # faults come and go
            sim.clear()
            for what, comp, amount in rng.sample(faults, rng.randint(0, 2)):
                (sim.inject_loss if what == "loss" else sim.inject_delay)(comp, amount)
        if step % 7 == 3:  # hosts stop counting and come back
            down = set(rng.sample(sorted(fabric.nodes()), rng.randint(0, 3)))
        for node, plan in plans.items():
            if rng.random() < 0.05:
                continue  # a report that did not arrive this time
            report = tpb.Report()
            report.probe_results.extend(sim.window_results(plan, rng))
            obs = observations(report)
            if obs and rng.random() < 0.05:
                obs[0] = obs[0]._replace(restarted=True)
            new.add(node, obs)
            old.add(node, obs)
        if step == 17:
            new.forget_paths()
            old.forget_paths()
        got, want = new.localise(), old.localise()
        assert _blames(got) == _blames(want), step
        named += len(got)
        # the topology view's share, kept from running sums and sliding maxima, is the oracle's too
        assert new.fabric_health == {c: h for c, h in old.health.items() if h["kind"] in ("leaf", "spine", "link")}
        assert new.health == old.health, step
        assert new.worst() == old.worst()
    assert named > 0  # the draws did put faults in front of the vote


def test_a_clean_window_has_no_bad_paths_and_health_for_every_component() -> None:
    fabric = generate_fabric(16, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True, window_s=5)
    clock = FakeClock()
    loc = ProbeLocaliser(fabric, config, clock=clock)
    nic_a, nic_b = sorted(fabric.nics())[:2]
    loc.add("x", [ProbeObs(nic_a, nic_b, "", 100, 0, 10.0, 2.0, False)])
    assert loc.localise() == []
    assert loc.health[nic_a]["sent"] == 100
    clock.advance(config.localise_window_s + 1)
    assert loc.localise() == []
    assert loc.health == {}  # aged out: nothing left in any running sum
    assert loc.sums is not None and loc.sums.empty()
