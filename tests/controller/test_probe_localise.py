"""The probe mesh through the decision core on a fake clock: plan pushed, results decided, the
faulty component named (a leaf, a leaf-spine cable, a NIC's cable, a slow host), a clean fabric
quiet, a restarting peer not a network fault, and a leaf blamed by probes and counters one incident."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.model import Incident
from controller.fabric import generate_fabric
from controller.fabric.model import Fabric
from controller.outputs.query import topology_response
from controller.outputs.web.api import probe_links_json
from controller.query.live import LiveQueries
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.probe_core import hello, probe_core


class Mesh:
    """A fleet on a fake clock: the real decision core, each node's results drawn from its pushed plan."""

    def __init__(self, tmp_path: Path, *, traced: bool = True, nodes: int = 32, per_block: int = 8) -> None:
        self.fabric: Fabric = generate_fabric(nodes, gpus_per_node=2, rails=2, nodes_per_block=per_block, spines=4)
        self.clock = FakeClock()
        self.core = probe_core(tmp_path, self.fabric, self.clock)
        for node in self.fabric.nodes():
            self.hello(node)
        self.sim = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of, traced=traced)
        self.rng = random.Random(7)
        self.seq = 0
        self.silent: set[str] = set()

    def hello(self, node: str) -> None:
        hello(self.core, node)

    def run(self, seconds: float) -> None:
        """Every 5 s each node reports one window of its plan; the core ticks every second."""
        for step in range(int(seconds)):
            self.clock.advance(1.0)
            if step % 5 == 4:
                self.seq += 1
                for node in self.fabric.nodes():
                    plan = self.core.registry.nodes[node].probe_plan
                    if plan is None or node in self.silent:
                        continue
                    report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                    report.probe_results.extend(self.sim.window_results(plan, self.rng))
                    self.core.report(node, report)
            self.core.tick()

    def incidents(self) -> list[Incident]:
        return self.core.open_incidents()


def _only(incidents: list[Incident]) -> Incident:
    assert len(incidents) == 1, [(i.kind, i.root_cause) for i in incidents]
    return incidents[0]


def test_the_plan_is_pushed_to_every_node_and_a_clean_fabric_stays_quiet(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(1)
    plans = {n: mesh.core.registry.nodes[n].probe_plan for n in mesh.fabric.nodes()}
    assert all(p is not None and p.targets for p in plans.values())
    mesh.run(300)
    assert mesh.incidents() == []


def test_one_percent_loss_on_a_leaf_blames_that_leaf_and_no_node(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    mesh.sim.inject_loss("leaf-b1-r0", 0.01)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("switch_fault", "leaf-b1-r0")
    ev = inc.evidence[0]["evidence"]
    assert ev["method"].startswith("007") and ev["lost"] > 0 and ev["pairs"]


def test_loss_on_one_leaf_spine_cable_blames_that_cable(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    cable = mesh.fabric.link_name("leaf-b2-r1", "spine-3")
    mesh.sim.inject_loss(cable, 0.02)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("link_fault", cable)
    # seen by people: the worst link first (topology show), red on the dashboard's fabric view
    probes = mesh.core.detection.probes
    assert probes is not None and probes.worst()[0]["component"] == cable
    levels = {p["name"]: p["level"] for p in probe_links_json(probes.health)}
    assert levels[cable] == "bad" and set(levels.values()) == {"bad", "ok"}
    queries = LiveQueries(mesh.core.store, mesh.core.detection, mesh.core.registry, mesh.core.jobs)
    view = queries.topology()
    assert view is not None
    summary = json.loads(topology_response(view).summary_json)  # what `starpulse topology show` prints
    assert summary["probe_worst"][0]["component"] == cable and summary["node"] == 32


def test_the_view_shows_a_slow_cable_while_it_is_slow_and_forgets_it_once_its_results_age_out(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    cable = mesh.fabric.link_name("leaf-b1-r0", "spine-2")
    mesh.sim.inject_delay(cable, 0.002)
    mesh.run(30)
    queries = LiveQueries(mesh.core.store, mesh.core.detection, mesh.core.registry, mesh.core.jobs)
    view = queries.topology()
    assert view is not None
    slow = {r["component"]: r for r in view.probe_worst}
    assert cable in slow and slow[cable]["p99_us"] >= 2000.0  # the added 2 ms, as the worst p99 through it
    assert view.probe_health[cable]["p99_us"] == slow[cable]["p99_us"]
    other = mesh.fabric.link_name("leaf-b1-r0", "spine-1")
    assert view.probe_health[other]["p99_us"] < 100.0  # the leaf's other uplink stays fast
    levels = {p["name"]: p["level"] for p in probe_links_json(view.probe_health)}
    assert levels[cable] == "warn" and levels[other] == "ok"
    mesh.sim.clear()
    mesh.run(40)  # one localisation window and more: every slow result has aged out
    health = queries.topology().probe_health  # type: ignore[union-attr]
    assert health[cable]["p99_us"] < 100.0
    assert {p["level"] for p in probe_links_json(health)} == {"ok"}


def test_an_untraced_uplink_is_a_path_fault_above_its_leaf_not_the_leaf(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, traced=False)
    mesh.run(30)
    mesh.sim.inject_loss(mesh.fabric.link_name("leaf-b2-r1", "spine-3"), 0.05)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("path_fault", "leaf-b2-r1")


def test_loss_on_one_nics_cable_blames_that_nic(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    mesh.sim.inject_loss("node-010/nic-1", 0.01)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("nic_fault", "node-010/nic-1")


def test_a_hosts_own_delay_blames_that_host_not_the_network(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    mesh.sim.inject_delay("node-012", 0.002)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("host_fault", "node-012")


def test_a_leaf_with_two_nics_and_one_bad_nic_blames_the_nic(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, nodes=8, per_block=2)
    mesh.run(30)
    mesh.sim.inject_loss("node-002/nic-0", 0.02)
    mesh.run(30)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("nic_fault", "node-002/nic-0")


def test_a_peer_that_goes_silent_or_restarts_is_not_a_network_fault(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    # node-005's agent restarts: for 10 s its responder is gone (every probe to it lost)...
    mesh.sim.inject_loss("node-005", 1.0)
    mesh.silent.add("node-005")
    mesh.run(10)
    # ...then it says Hello again and answers.
    mesh.sim.clear("node-005")
    mesh.silent.discard("node-005")
    mesh.hello("node-005")
    mesh.run(60)
    assert mesh.incidents() == []


def test_a_fault_that_ends_resolves_after_the_hysteresis(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    mesh.sim.inject_loss("leaf-b0-r1", 0.02)
    mesh.run(30)
    assert _only(mesh.incidents()).root_cause == "leaf-b0-r1"
    mesh.sim.clear()
    mesh.run(120)
    assert mesh.incidents() == []


@pytest.mark.parametrize("rail", [0])
def test_a_leaf_blamed_by_probes_and_by_nic_counters_is_one_incident(tmp_path: Path, rail: int) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    leaf = f"leaf-b1-r{rail}"
    mesh.sim.inject_loss(leaf, 0.02)
    # the same leaf's host ports also go down on several of its nodes (counters' side)
    for i, nic in enumerate(mesh.fabric.nics_on_leaf(leaf)[:3]):
        node = mesh.fabric.host_of(nic)
        ev = tpb.Event(
            seq=1,
            timestamp_ms=mesh.clock.time_ms(),
            kind=tpb.EVENT_KIND_NIC_LINK_DOWN,
            severity=tpb.SEVERITY_CRITICAL,
            component=f"mlx5_{rail}/1",
            message="port down",
        )
        mesh.core.events(node, [ev])
        assert i < 3
    mesh.run(40)
    inc = _only(mesh.incidents())
    assert (inc.kind, inc.root_cause) == ("switch_fault", leaf)
    rules = {e["rule"] for e in inc.evidence}
    assert "probe.loss" in rules and len(rules) >= 2
