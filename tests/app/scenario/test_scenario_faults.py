"""Every fault kind of the simulator's table, through the scenario format and a simulated cluster.

Table-driven over FAULTS: each kind on each target shape it takes is parsed from a
scenario, injected into a SimCluster (not started: nothing connects, the fakes are read
directly) and cleared, watched against the cluster's own healthy state and counter pace. A kind added to the table is
covered here, and its bad parameters are checked for one clear line, without a new case.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.sim.fault_kinds import FaultKind
from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from controller.fabric import Fabric
from controller.fabric.model import LINK_SEPARATOR
from starpulse.app.demo_faults import fault_menu
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import PORT_SEPARATOR, FaultSpec, ScenarioError, parse_scenario
from tests.fault_watch import View, Watch, examples, node_view, switch_view

FABRIC = {"nodes": 2, "gpus_per_node": 2, "rails": 2, "nodes_per_block": 2, "spines": 1}
CASES = [(kind, shape) for kind in FAULTS for shape in sorted(kind.targets)]


def target_of(fabric: Fabric, shape: str) -> str:
    """The first target of ``shape`` in the fabric."""
    node = fabric.nodes()[0]
    nic = fabric.nics_of(node)[0]
    leaf = fabric.leaf_of(nic)
    return {
        "node": node,
        "gpu": f"{node}/gpu-1",
        "nic": nic,
        "switch": fabric.leaves()[0],
        "port": f"{fabric.leaves()[0]}{PORT_SEPARATOR}1",
        "link": f"{nic}{LINK_SEPARATOR}{leaf}",
    }[shape]


def one_fault(kind: FaultKind, shape: str, **params: Any) -> dict[str, Any]:
    """A scenario with a single fault of ``kind`` on the first target of ``shape``."""
    fabric = parse_scenario({"name": "f", "fabric": FABRIC, "duration_s": 10}, "mem").build_fabric()
    target = target_of(fabric, shape)
    fault: dict[str, Any] = {"at_s": 1, "kind": kind.name, **examples(kind, shape), **params}
    fault.update({"targets": [target]} if kind.many else {"target": target})
    vendors = [kind.needs_vendor or "nvidia"]  # a vendor's own GPU kinds act on that vendor's nodes
    return {"name": "f", "fabric": FABRIC, "vendors": vendors, "duration_s": 10, "faults": [fault]}


def cluster_view(cluster: SimCluster) -> View:
    """All the cluster's hardware, each node's LLDP, whether each agent is cut off or stopped, and
    what the simulated data plane does to probes (the probe mesh's kinds show only there)."""
    view: View = {}
    for name, sim in cluster.sims.items():
        view |= node_view(sim, f"{name}/")
        view[f"{name}/lldp"] = cluster._lldp_json(name)
    for name, switch in cluster.switches.items():
        view |= switch_view(switch, f"{name}/")
    for name, member in cluster._members.items():
        view[f"agent/{name}"] = (member.agent.link._blocked, member.stop.is_set())
    view["data_plane"] = (dict(cluster.data_plane.loss), dict(cluster.data_plane.delay_s))  # what probes cross
    return view


def step(cluster: SimCluster) -> None:
    """A second of node traffic and a counter step on each switch."""
    for sim in cluster.sims.values():
        sim.advance(1.0)
    for switch in cluster.switches.values():
        switch.advance(5.0)


async def settle(cluster: SimCluster) -> None:
    """Wait for agent restarts in flight (a node coming back builds a fresh agent in a thread)."""
    for _ in range(500):
        if not cluster._pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("an agent restart did not finish")


@pytest.mark.parametrize(("kind", "shape"), CASES, ids=[f"{k.name}-{s}" for k, s in CASES])
async def test_every_fault_shows_and_clears_in_a_cluster(kind: FaultKind, shape: str, tmp_path: Path) -> None:
    """Each kind on each shape: injected it shows on the hardware or agents; cleared, all is healthy again."""
    scenario = parse_scenario(one_fault(kind, shape), "mem")
    fault = scenario.faults[0]
    cluster = SimCluster(scenario, tmp_path, "127.0.0.1:9", 0.5)
    try:
        watch = Watch(lambda: cluster_view(cluster), lambda: step(cluster))
        cluster.inject(fault)
        assert watch.shows(), f"{fault.describe()} changed nothing"
        cluster.clear(fault)
        await settle(cluster)
        assert watch.left_behind() == [], fault.describe()
    finally:
        await cluster.stop()


async def test_overlapping_faults_hold_until_the_last_clears(tmp_path: Path) -> None:
    """A NIC down inside a dead leaf stays down when the leaf comes back, and comes up on its own clear."""
    data = one_fault(FAULTS["switch_down"], "switch")
    scenario = parse_scenario(data, "mem")
    leaf_down = scenario.faults[0]
    nic = next(n for n in scenario.build_fabric().nics_on_leaf(leaf_down.target))
    nic_down = FaultSpec(at_s=1, kind="nic_down", target=nic)
    cluster = SimCluster(scenario, tmp_path, "127.0.0.1:9", 0.5)
    host, index = cluster.fabric.host_of(nic), cluster.fabric.rail_of(nic)
    try:
        for fault in (leaf_down, nic_down):
            cluster.inject(fault)
        cluster.clear(leaf_down)
        assert not cluster.sims[host].sysfs._nics[index].up
        cluster.clear(nic_down)
        assert cluster.sims[host].sysfs._nics[index].up
    finally:
        await cluster.stop()


def bad_values(kind: FaultKind) -> list[tuple[str, str, Any]]:
    """(shape, key, value) for a value of the wrong type for every parameter of ``kind``."""
    return [
        (shape, p.name, "not-a-number") for p in kind.params for shape in sorted(kind.targets) if p.applies_to(shape)
    ]


BAD = [(kind, shape, key, value) for kind in FAULTS for shape, key, value in bad_values(kind)]


@pytest.mark.parametrize(("kind", "shape", "key", "value"), BAD, ids=[f"{k.name}-{s}-{p}" for k, s, p, _ in BAD])
def test_a_bad_parameter_is_one_line_naming_file_fault_and_key(
    kind: FaultKind, shape: str, key: str, value: Any
) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(one_fault(kind, shape, **{key: value}), "scenarios/bad.yaml")
    text = str(info.value)
    assert text.startswith(f"scenarios/bad.yaml: faults[0].{key}: must be "), text
    assert "\n" not in text


def test_bad_parameters_at_the_command_line(tmp_path: Path) -> None:
    """`starpulse scenario run` on a bad parameter: exit 2, one line naming the file, fault and key."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(one_fault(FAULTS["nic_flap"], "nic", count=0)))
    out = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "scenario", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"starpulse scenario run: {path}: faults[0].count: must be >= 1, got 0"]


def test_every_kind_parses_on_every_shape_it_takes() -> None:
    """Defaults are filled in; a shape the kind does not take is refused naming the target."""
    for kind, shape in CASES:
        fault = parse_scenario(one_fault(kind, shape), "mem").faults[0]
        assert fault.kind == kind.name
        assert fault.params == kind.check_params(examples(kind, shape), shape)
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.target: node_down takes a node, not a gpu"):
        parse_scenario(
            {
                **one_fault(FAULTS["gpu_lost"], "gpu"),
                "faults": [{"at_s": 1, "kind": "node_down", "target": "node-000/gpu-0"}],
            },
            "mem",
        )


def test_the_demo_draws_from_the_table(tmp_path: Path) -> None:
    """The demo's menu is the table's demo entries, in table order, and each one injects and clears on a node."""
    menu = fault_menu()
    assert menu and [k for k, _, _ in menu] == [k.name for k in FAULTS if k.node is not None for _ in k.demo]
    sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
    for kind, part, params in menu:
        sim.inject(kind, f"{part}-0", **params)
        sim.clear(kind, f"{part}-0", **params)
