"""The probe window held in pieces (each detection shard its own nodes' results) localises as the
window held whole: the same blames with the same evidence, the same topology view and the same
conditions, through faults coming and going, hosts excluded and back, restarted peers, nodes
that stop reporting and come back, a wiring change, and results that arrive between the
localisation's two questions (they wait, and count from the next one). Checked against the
whole-window localiser and the pass-over-everything oracle."""

from __future__ import annotations

import pickle
import random
import zlib
from typing import Any

import pytest

from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.probe_sums import ProbeObs, ProbeSums, observations
from controller.detect.probes import Blame, ProbeLocaliser
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.probe_reference import ReferenceLocaliser


def _blames(blames: list[Blame]) -> list[tuple[Any, ...]]:
    return [(b.component, b.kind, b.what, b.votes, b.sent, b.lost, b.pairs) for b in blames]


def _conditions(changes: list[Any]) -> list[tuple[Any, ...]]:
    return [(ch.kind, ch.condition.rule, ch.condition.component, ch.condition.evidence) for ch in changes]


class _Split:
    """A localiser whose window is held by ``n`` holders, each on its own copy of the fabric (as
    the shards get it), a node's results going to one holder by the shards' hash."""

    def __init__(self, fabric: Any, config: ProbeConfig, clock: FakeClock, node_ok: Any, n: int) -> None:
        self.loc = ProbeLocaliser(fabric, config, clock=clock, node_ok=node_ok, local=False)
        self.holders = [ProbeSums(pickle.loads(pickle.dumps(fabric)), config) for _ in range(n)]
        self.clock = clock
        self.asked_keys = 0

    def add(self, node: str, obs: list[ProbeObs]) -> None:
        self.holders[zlib.crc32(node.encode()) % len(self.holders)].add(self.clock.time_ms(), obs)

    def localise(self, meanwhile: list[tuple[str, list[ProbeObs]]]) -> list[Blame]:
        """Both rounds, with ``meanwhile``'s results arriving between the two questions."""
        req = self.loc.request()
        snaps = []
        for h in self.holders:
            snaps.append(h.snapshot(pickle.loads(pickle.dumps(req))))
            h.hold()
        for node, obs in meanwhile:
            self.add(node, obs)
        question = self.loc.merge(pickle.loads(pickle.dumps(snaps)))
        records = []
        sample: list[float] = []
        if question is not None:
            self.asked_keys += bool(question.comps)
            for h in self.holders:
                records += pickle.loads(pickle.dumps(h.keys_through(question.comps)))
                sample += h.delay_sample(question.every) if question.every else []
        for h in self.holders:
            h.release()
        return self.loc.conclude(records, sample)

    def forget_paths(self, fabric: Any) -> None:
        self.loc.forget_paths()
        for h in self.holders:
            h.forget_paths(pickle.loads(pickle.dumps(fabric)))


def _faults(fabric: Any, rng: random.Random) -> list[tuple[str, str, float]]:
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


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("traced", [True, False])
def test_the_window_held_in_shards_localises_as_the_window_held_whole(seed: int, traced: bool) -> None:
    rng = random.Random(seed)
    fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True, window_s=5, replan_min_s=0, persist_windows=1, clear_windows=2)
    plans = {n: plan_mesh(fabric, config, version=1).for_node(n, config) for n in fabric.nodes()}
    clock = FakeClock()
    down: set[str] = set()

    def node_ok(node: str, since_ms: int) -> bool:
        return node not in down

    whole = ProbeLocaliser(fabric, config, clock=clock, node_ok=node_ok)
    split = _Split(fabric, config, clock, node_ok, 3)
    oracle = ReferenceLocaliser(fabric, config, clock=clock, node_ok=node_ok)
    sim = SimProbeFabric(fabric.leaf_of, fabric.spines_of, traced=traced)
    faults = _faults(fabric, rng)
    silent: set[str] = set()  # nodes that left (no reports) for a while
    named = opened = 0
    for step in range(30):
        clock.advance(5.0)
        if step % 6 == 0:  # faults come and go
            sim.clear()
            for what, comp, amount in rng.sample(faults, rng.randint(1, 2)):
                (sim.inject_loss if what == "loss" else sim.inject_delay)(comp, amount)
        if step % 7 == 3:  # hosts stop counting and come back
            down = set(rng.sample(sorted(fabric.nodes()), rng.randint(0, 3)))
        if step in (22, 23):  # most hosts out at once (as after a controller start): the rest still count
            down = set(sorted(fabric.nodes())[:-6])
        if step % 9 == 2:  # nodes leave (their results age out) and join again
            silent = set(rng.sample(sorted(fabric.nodes()), 2))
        late: list[tuple[str, list[ProbeObs]]] = []
        for node, plan in plans.items():
            if node in silent or rng.random() < 0.05:
                continue
            report = tpb.Report()
            report.probe_results.extend(sim.window_results(plan, rng))
            obs = observations(report)
            if obs and rng.random() < 0.05:
                obs[0] = obs[0]._replace(restarted=True)  # the peer's responder restarted
            if rng.random() < 0.1:
                late.append((node, obs))  # arrives while the shards hold their windows
                continue
            whole.add(node, obs)
            split.add(node, obs)
            oracle.add(node, obs)
        if step == 17:
            whole.forget_paths()
            split.forget_paths(fabric)
            oracle.forget_paths()
        want, got, reference = whole.localise(), split.localise(late), oracle.localise()
        assert _blames(got) == _blames(want), step
        assert [(b.component, b.kind, b.what) for b in got] == [(b.component, b.kind, b.what) for b in reference]
        assert split.loc.background_loss == whole.background_loss
        assert split.loc.delay_baseline == whole.delay_baseline
        assert split.loc.fabric_health == whole.fabric_health, step
        fabric_kinds = ("leaf", "spine", "link")
        assert split.loc.fabric_health == {c: h for c, h in oracle.health.items() if h["kind"] in fabric_kinds}
        assert split.loc.worst() == whole.worst()
        changes = split.loc.conditions(got)
        assert _conditions(changes) == _conditions(whole.conditions(want)), step
        opened += sum(1 for ch in changes if ch.kind == "opened")
        named += len(got)
        for node, obs in late:  # the held results, after the localisation, as the shards apply them
            whole.add(node, obs)
            oracle.add(node, obs)
    assert named > 0 and opened > 0  # the draws did put faults in front of the vote
    assert split.asked_keys > 0


def test_a_clean_window_asks_no_second_question() -> None:
    """Without a suspect in the vote's first round no key's detail is asked for (the cost of a
    localisation on a clean fabric is the per-component snapshots alone)."""
    fabric = generate_fabric(16, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    config = ProbeConfig(enabled=True, window_s=5)
    clock = FakeClock()
    split = _Split(fabric, config, clock, lambda node, since_ms: True, 2)
    nics = sorted(fabric.nics())
    for i, nic in enumerate(nics):
        peer = nics[(i + 1) % len(nics)]
        # a little stray loss everywhere, never enough on one component
        split.add(fabric.host_of(nic), [ProbeObs(nic, peer, "", 1000, 1 if i % 5 == 0 else 0, 10.0, 2.0, False)])
    assert split.localise([]) == []
    assert split.asked_keys == 0
    assert split.loc.fabric_health  # the view still has every leaf's traffic
    assert all(h["sent"] > 0 for h in split.loc.fabric_health.values())
