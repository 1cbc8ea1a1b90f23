"""Scenario files: the documented example parses, and every malformed file fails naming file, fault and key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from starpulse.app.scenario import ScenarioError, load_scenario, parse_scenario
from starpulse.app.scenario.spec import INCIDENT_KINDS, switch_port, target_kind

EXAMPLE = """\
name: leaf-down
fabric: {nodes: 32, gpus_per_node: 8, rails: 8, nodes_per_block: 16, spines: 8}
spares: 2              # idle spare nodes beyond `nodes`
jobs: [{name: llm, nodes: 32, checkpoint_every_s: 10}]
interval_s: 0.5        # agent report interval
duration_s: 30
faults:
  - {at_s: 5, kind: switch_down, target: leaf-b0-r3}
  - {at_s: 12, kind: gpu_xid, target: node-004/gpu-2, xid: 79}
expect:
  incidents: [{kind: switch_fault, root_cause: leaf-b0-r3}]
  forbid_kinds: [gpu_fault, nic_fault]
  max_incidents: 1
"""

BASE: dict[str, Any] = {
    "name": "t",
    "fabric": {"nodes": 4, "gpus_per_node": 8, "rails": 8, "nodes_per_block": 4, "spines": 2},
    "spares": 1,
    "jobs": [{"name": "llm", "nodes": 4, "checkpoint_every_s": 10}],
    "interval_s": 0.5,
    "duration_s": 30,
    "faults": [],
}


G0, N0 = "node-000/gpu-0", "node-000/nic-0"


def with_fault(**fault: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["faults"] = [{"at_s": 1, "kind": "gpu_xid", "target": "node-000/gpu-0", "xid": 79}, fault]
    return data


def test_example_file_parses(tmp_path: Path) -> None:
    path = tmp_path / "leaf-down.yaml"
    path.write_text(EXAMPLE)
    s = load_scenario(path)
    assert s.name == "leaf-down"
    assert (s.fabric.nodes, s.fabric.rails, s.fabric.nodes_per_block, s.fabric.spines, s.spares) == (32, 8, 16, 8, 2)
    assert s.interval_s == 0.5 and s.duration_s == 30
    assert [(f.at_s, f.kind, f.target) for f in s.faults] == [
        (5, "switch_down", "leaf-b0-r3"),
        (12, "gpu_xid", "node-004/gpu-2"),
    ]
    assert s.faults[1].params == {"xid": 79}
    assert s.faults[0].until_s is None
    assert s.expect is not None
    assert [(e.kind, e.root_cause) for e in s.expect.incidents] == [("switch_fault", "leaf-b0-r3")]
    assert s.expect.forbid_kinds == ["gpu_fault", "nic_fault"] and s.expect.max_incidents == 1
    fabric = s.build_fabric()
    assert len(fabric.nodes()) == 34 and len(fabric.spares()) == 2
    # a job of K nodes takes the first K non-spare nodes; spares run nothing
    assert s.jobs_of("node-000") == ["llm"] and s.jobs_of("node-031") == ["llm"]
    assert s.jobs_of("node-032") == [] and s.jobs_of("node-033") == []


def test_defaults_and_params() -> None:
    data = copy.deepcopy(BASE)
    data.pop("interval_s")
    data["jobs"] = [{"name": "a", "nodes": 2}, {"name": "b", "nodes": 3}]
    data["faults"] = [
        {"at_s": 0, "kind": "gpu_slow", "target": "node-001/gpu-3"},
        {"at_s": 1, "kind": "nic_flap", "target": "node-001/nic-3", "count": 2, "until_s": 5},
        {"at_s": 2, "kind": "switch_port_down", "target": "leaf-b0-r1:port-4"},
        {"at_s": 2, "kind": "switch_port_down", "target": "spine-1<->leaf-b0-r1"},
        {"at_s": 2, "kind": "switch_port_down", "target": "node-002/nic-1<->leaf-b0-r1"},
        {"at_s": 3, "kind": "pfc_storm", "target": "leaf-b0-r1:port-0", "queue": 4},
        {"at_s": 3, "kind": "pfc_storm", "target": "node-000/nic-0"},
        {"at_s": 3, "kind": "optics_degraded", "target": "node-000/nic-0"},
        {"at_s": 4, "kind": "partition", "targets": ["node-000", "node-003"], "until_s": 8},
        {"at_s": 4, "kind": "node_down", "target": "node-004"},
        {"at_s": 4, "kind": "switch_down", "target": "spine-0"},
    ]
    s = parse_scenario(data, "mem")
    assert s.interval_s == 0.5
    assert s.faults[0].params == {"factor": 0.7}
    assert s.faults[1].params == {"count": 2} and s.faults[1].until_s == 5
    assert s.faults[5].params == {"queue": 4}
    assert s.faults[8].targets == ["node-000", "node-003"] and s.faults[8].target == ""
    assert s.jobs_of("node-000") == ["a", "b"] and s.jobs_of("node-002") == ["b"] and s.jobs_of("node-003") == []
    assert s.job_nodes("b") == ["node-000", "node-001", "node-002"]


def test_target_helpers() -> None:
    fabric = parse_scenario(copy.deepcopy(BASE), "mem").build_fabric()
    # leaf ports: 4 node slots then one uplink per spine; spine ports: one per leaf
    assert switch_port(fabric, "leaf-b0-r2:port-5") == ("leaf-b0-r2", "Ethernet20")
    assert fabric.peer_at("leaf-b0-r2", "Ethernet20") == "spine-1"
    assert switch_port(fabric, "spine-0:port-7") == ("spine-0", "Ethernet28")
    assert [target_kind(fabric, t) for t in ("node-000", "node-000/gpu-1", "node-000/nic-1", "spine-1")] == [
        "node",
        "gpu",
        "nic",
        "switch",
    ]


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("unknown kind", with_fault(at_s=1, kind="gpu_melt", target=G0), "faults[1].kind: unknown fault kind"),
    ("missing kind", with_fault(at_s=1, target=G0), "faults[1].kind: unknown fault kind None"),
    ("missing target", with_fault(at_s=1, kind="nic_down"), "faults[1].target: missing target"),
    ("node not in fabric", with_fault(at_s=1, kind="node_down", target="node-099"), "faults[1].target: 'node-099'"),
    ("gpu index", with_fault(at_s=1, kind="gpu_lost", target="node-000/gpu-8"), "faults[1].target:"),
    ("nic index", with_fault(at_s=1, kind="nic_down", target="node-000/nic-9"), "faults[1].target:"),
    ("unknown leaf", with_fault(at_s=1, kind="switch_down", target="leaf-b3-r0"), "faults[1].target:"),
    ("port too high", with_fault(at_s=1, kind="switch_port_down", target="leaf-b0-r0:port-6"), "ports 0..5"),
    ("port not a number", with_fault(at_s=1, kind="switch_port_down", target="leaf-b0-r0:port-x"), "not a switch port"),
    ("port on a node", with_fault(at_s=1, kind="switch_port_down", target="node-000:port-1"), "not a switch"),
    ("no such cable", with_fault(at_s=1, kind="switch_port_down", target="node-000/nic-0<->leaf-b0-r1"), "no cable"),
    ("bad link end", with_fault(at_s=1, kind="switch_port_down", target="leaf-b0-r0<->spine-9"), "spine-9"),
    ("wrong shape", with_fault(at_s=1, kind="gpu_xid", target=N0, xid=79), "gpu_xid takes a gpu"),
    ("switch_down on a node", with_fault(at_s=1, kind="switch_down", target="node-000"), "takes a switch"),
    ("at_s negative", with_fault(at_s=-1, kind="node_down", target="node-000"), "faults[1].at_s: must be >= 0"),
    ("at_s at end", with_fault(at_s=30, kind="node_down", target="node-000"), "faults[1].at_s: 30 is not inside"),
    ("at_s not a number", with_fault(at_s="soon", kind="node_down", target="node-000"), "faults[1].at_s: must be a"),
    ("until before at", with_fault(at_s=5, until_s=5, kind="node_down", target="node-000"), "until_s: 5 must"),
    ("xid missing", with_fault(at_s=1, kind="gpu_xid", target=G0), "faults[1].xid: is required"),
    ("xid string", with_fault(at_s=1, kind="gpu_xid", target=G0, xid="79"), "faults[1].xid: must be an"),
    ("xid bool", with_fault(at_s=1, kind="gpu_xid", target=G0, xid=True), "faults[1].xid: must be an"),
    ("factor zero", with_fault(at_s=1, kind="gpu_slow", target=G0, factor=0), "faults[1].factor"),
    ("factor > 1", with_fault(at_s=1, kind="gpu_slow", target=G0, factor=1.5), "in (0, 1]"),
    ("count zero", with_fault(at_s=1, kind="nic_flap", target=N0, count=0), "faults[1].count: must be >="),
    ("count float", with_fault(at_s=1, kind="nic_flap", target=N0, count=2.5), "faults[1].count"),
    ("unknown param", with_fault(at_s=1, kind="nic_down", target=N0, xid=3), "faults[1].xid: unknown key"),
    ("partition no targets", with_fault(at_s=1, kind="partition"), "faults[1].targets: a partition needs"),
    ("partition target", with_fault(at_s=1, kind="partition", target="node-000"), "faults[1].target: a partition"),
    ("partition bad node", with_fault(at_s=1, kind="partition", targets=["node-000", "x"]), "faults[1].targets[1]"),
    ("partition a gpu", with_fault(at_s=1, kind="partition", targets=["node-000/gpu-1"]), "faults[1].targets[0]"),
    (
        "targets elsewhere",
        with_fault(at_s=1, kind="node_down", targets=["node-000"]),
        "only a collective_stall or a partition takes `targets`",
    ),
    ("fault not a map", {**BASE, "faults": ["node_down"]}, "faults[0]: must be a mapping"),
    ("faults not a list", {**BASE, "faults": {"at_s": 1}}, "faults: must be a list"),
    ("no name", {k: v for k, v in BASE.items() if k != "name"}, "name: is required"),
    ("no duration", {k: v for k, v in BASE.items() if k != "duration_s"}, "duration_s: is required"),
    ("unknown top key", {**BASE, "faultz": []}, "faultz: unknown key"),
    ("no fabric", {k: v for k, v in BASE.items() if k != "fabric"}, "fabric.nodes: is required"),
    ("fabric nodes 0", {**BASE, "fabric": {"nodes": 0}}, "fabric.nodes: must be an integer >= 1, got 0"),
    ("fabric key", {**BASE, "fabric": {"nodes": 2, "leaves": 3}}, "fabric.leaves: unknown key"),
    ("spares negative", {**BASE, "spares": -1}, "spares: must be an integer >= 0, got -1"),
    ("interval zero", {**BASE, "interval_s": 0}, "interval_s: must be a number > 0, got 0"),
    ("job too big", {**BASE, "jobs": [{"name": "j", "nodes": 5}]}, "jobs[0].nodes: 5 nodes but"),
    ("job dup", {**BASE, "jobs": [{"name": "j", "nodes": 1}, {"name": "j", "nodes": 1}]}, "jobs[1].name: duplicate"),
    ("job no name", {**BASE, "jobs": [{"nodes": 1}]}, "jobs[0].name: is required"),
    (
        "expect kind",
        {**BASE, "expect": {"incidents": [{"kind": "meltdown"}]}},
        "expect.incidents[0].kind: must be one of agent_conflict, gpu_fault, host_fault",
    ),
    (
        "expect root",
        {**BASE, "expect": {"incidents": [{"kind": "switch_fault", "root_cause": "leaf-b9-r0"}]}},
        "expect.incidents[0].root_cause",
    ),
    (
        "expect forbid",
        {**BASE, "expect": {"forbid_kinds": ["nope"]}},
        "expect.forbid_kinds[0]: must be one of agent_conflict, gpu_fault, host_fault",
    ),
    (
        "expect clash",
        {**BASE, "expect": {"incidents": [{"kind": "gpu_fault"}], "forbid_kinds": ["gpu_fault"]}},
        "expect.forbid_kinds: forbids 'gpu_fault'",
    ),
    (
        "expect max",
        {**BASE, "expect": {"max_incidents": -1}},
        "expect.max_incidents: must be an integer >= 0, or null, got -1",
    ),
    (
        "expect max below",
        {**BASE, "expect": {"incidents": [{"kind": "gpu_fault"}, {"kind": "nic_fault"}], "max_incidents": 1}},
        "fewer than the 2",
    ),
    ("expect key", {**BASE, "expect": {"incidnets": []}}, "expect.incidnets: unknown key"),
]


@pytest.mark.parametrize(("data", "message"), [(d, m) for _, d, m in BAD], ids=[i for i, _, _ in BAD])
def test_invalid_scenarios(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "scenarios/bad.yaml")
    text = str(info.value)
    assert text.startswith("scenarios/bad.yaml: "), text
    assert message in text, text


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: not valid YAML"):
        load_scenario(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(ScenarioError, match=r"list\.yaml: scenario: must be a mapping"):
        load_scenario(top)


def test_every_error_of_a_file_in_one_run() -> None:
    """Shape errors and what only the fabric and the fault table can say, each a line with the key."""
    data = {
        **BASE,
        "spares": -1,
        "interval_s": "fast",
        "vendors": ["nvidia", "intel"],
        "jobs": [{"name": "j", "nodes": 0, "gpus": 2}],
        "expect": {"incidents": [{"kind": "meltdown"}], "max_incidents": -1},
    }
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "bad.yaml")
    assert sorted(info.value.errors) == [
        "bad.yaml: expect.incidents[0].kind: must be one of " + ", ".join(sorted(INCIDENT_KINDS)) + ", got 'meltdown'",
        "bad.yaml: expect.max_incidents: must be an integer >= 0, or null, got -1",
        "bad.yaml: interval_s: must be a number > 0, got 'fast'",
        "bad.yaml: jobs[0].gpus: unknown key",
        "bad.yaml: jobs[0].nodes: must be an integer >= 1, got 0",
        "bad.yaml: spares: must be an integer >= 0, got -1",
        "bad.yaml: vendors[1]: must be one of nvidia, amd, ascend, got 'intel'",
    ]


def test_every_fault_and_fabric_check_in_one_run() -> None:
    """Once the shape is right, each fault and each cross-reference reports in the same run."""
    data = {
        **BASE,
        "jobs": [{"name": "j", "nodes": 1}, {"name": "j", "nodes": 99}],
        "faults": [
            {"at_s": 1, "kind": "gpu_melt", "target": G0},
            {"at_s": 99, "kind": "node_down", "target": "node-000"},
            "node_down",
        ],
        "expect": {"incidents": [{"kind": "switch_fault", "root_cause": "leaf-b9-r0"}], "evictions": ["node-999"]},
    }
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "bad.yaml")
    assert [line.split(":")[1].strip() for line in info.value.errors] == ["faults[2]"]
    del data["faults"][2]
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "bad.yaml")
    assert [line.split(": ")[1] for line in info.value.errors] == [
        "jobs[1].name",
        "jobs[1].nodes",
        "faults[0].kind",
        "faults[1].at_s",
        "expect.incidents[0].root_cause",
        "expect.evictions",
    ]


def test_an_empty_jobs_key_is_no_jobs_as_before() -> None:
    assert parse_scenario({**BASE, "jobs": None}, "mem").jobs == []
