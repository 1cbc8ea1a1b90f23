"""A mixed fleet in the simulator: nodes of each vendor on their fakes, their faults, and the scenario format's
``vendors`` and ``guards``. The mixed-fleet scenario itself runs in tests/test_scenarios.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.factory import build_collectors
from agent.runtime import CollectorSet
from agent.sim.fault_kinds import UnknownFault
from agent.sim.node import SimNode
from starpulse.app.scenario import ScenarioError, parse_scenario
from starpulse.core.findings import Finding

BASE: dict[str, Any] = {
    "name": "mixed",
    "fabric": {"nodes": 6, "gpus_per_node": 4, "rails": 2, "nodes_per_block": 2, "spines": 1},
    "vendors": ["nvidia", "amd", "ascend"],
    "duration_s": 10,
}


def one_cycle(sim: SimNode) -> tuple[Any, list[Finding]]:
    findings: list[Finding] = []
    plan = build_collectors("sim", findings.append, sim=sim, kmsg_path=None, lldp=False, ethtool=False)
    collectors = CollectorSet(plan.collectors)
    collectors.probe()
    inventory = collectors.describe()
    result = collectors.collect(seq=1)
    collectors.close()
    return inventory, findings + result.findings


@pytest.mark.parametrize(
    ("vendor", "model"),
    [("nvidia", "NVIDIA H100 80GB HBM3"), ("amd", "AMD Instinct MI300X"), ("ascend", "Ascend 910B4")],
)
def test_sim_node_of_each_vendor_reports_through_its_real_backend(vendor: str, model: str, tmp_path: Path) -> None:
    sim = SimNode("node-001", tmp_path, gpus=4, nics=2, vendor=vendor)
    inventory, findings = one_cycle(sim)
    assert {g.vendor for g in inventory.gpus} == {vendor} and inventory.gpus[0].model == model
    assert findings == []
    # GPU i sits beside NIC i on each vendor: the PCIe pairing uses the same bus numbers.
    assert {g.pci_bus_id.lower()[-7:] for g in inventory.gpus} == {f"{b:02x}:00.0" for b in sim._gpu_buses(4)}


def test_vendor_faults_on_their_nodes(tmp_path: Path) -> None:
    amd = SimNode("node-002", tmp_path / "a", gpus=4, nics=2, vendor="amd")
    amd.inject("amd_ras_uncorrectable", "gpu-3", count=2)
    _, findings = one_cycle(amd)
    assert [(f.kind, f.component, f.vendor, f.vendor_code) for f in findings] == [("ecc_dbe", "gpu-3", "amd", "UMC")]
    assert "2 uncorrectable hardware errors detected in umc block" in Path(amd.kmsg_path).read_text()
    ascend = SimNode("node-004", tmp_path / "b", gpus=4, nics=2, vendor="ascend")
    ascend.inject("ascend_fault", "gpu-1", code=0x80E18005)
    _, findings = one_cycle(ascend)
    assert [(f.kind, f.component, f.vendor_code) for f in findings] == [("accel_fault", "gpu-1", "80E18005")]
    with pytest.raises(UnknownFault, match="not AMD"):
        ascend.inject("amd_xgmi_down", "gpu-0")


def test_scenario_vendors_by_block_and_guards() -> None:
    s = parse_scenario({**BASE, "guards": {"max_evictions_per_window": 4, "max_fleet_share": 0.5}}, "mem")
    assert [s.vendor_of(n) for n in ("node-000", "node-002", "node-004", "node-005")] == [
        "nvidia",
        "amd",
        "ascend",
        "ascend",
    ]
    assert s.guards == {"max_evictions_per_window": 4, "max_fleet_share": 0.5}
    assert parse_scenario({k: v for k, v in BASE.items() if k != "vendors"}, "mem").vendor_of("node-004") == "nvidia"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vendors": ["nvidia", "intel"]}, "mem: vendors[1]: must be one of nvidia, amd, ascend, got 'intel'"),
        ({"vendors": []}, "mem: vendors: must be a non-empty list"),
        (
            {"guards": {"max_fleet_share": 2}},
            "mem: guards.max_fleet_share: must be a number > 0 and <= 1, or null, got 2",
        ),
        ({"guards": {"breaker": 1}}, "mem: guards.breaker: unknown key"),
        (
            {"faults": [{"at_s": 1, "kind": "amd_xgmi_down", "target": "node-000/gpu-1"}]},
            "mem: faults[0].target: amd_xgmi_down acts on amd GPUs; node-000 has nvidia ones",
        ),
        (
            {"faults": [{"at_s": 1, "kind": "gpu_xid", "target": "node-004/gpu-1", "xid": 79}]},
            "mem: faults[0].target: gpu_xid acts on nvidia GPUs; node-004 has ascend ones",
        ),
    ],
)
def test_bad_mixed_scenarios_are_one_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({**BASE, **change}, "mem")
    assert str(err.value).startswith(message), str(err.value)


# -- outputs name the vendor -------------------------------------------------------------------


def test_agent_metrics_name_vendor_and_model_and_the_neutral_fields(tmp_path: Path) -> None:
    """starpulse_gpu_info carries vendor and model; the neutral fields are their own series."""
    from tests.support.metrics import exposition, find, one

    sim = SimNode("node-002", tmp_path, gpus=2, nics=1, vendor="amd")
    sim.inject("amd_ras_uncorrectable", "gpu-1", count=3)
    sim.inject("amd_xgmi_down", "gpu-1", link=2)
    plan = build_collectors("sim", None, sim=sim, kmsg_path=None, lldp=False, ethtool=False)
    collectors = CollectorSet(plan.collectors)
    collectors.probe()
    inventory = collectors.describe()
    report = collectors.collect(seq=1).report
    collectors.close()
    text = exposition("node-002", inventory, report, None)
    (info,) = find(text, "starpulse_gpu_info", gpu="1")
    assert (info.labels["vendor"], info.labels["model"]) == ("amd", "AMD Instinct MI300X")
    assert one(text, "starpulse_gpu_memory_errors_uncorrectable_total", gpu="1") == 3
    assert one(text, "starpulse_gpu_ras_uncorrectable_errors_total", gpu="1", block="UMC") == 3
    assert one(text, "starpulse_gpu_interconnect_links_down", gpu="1") == 1
    assert one(text, "starpulse_gpu_interconnect_links_down", gpu="0") == 0


def test_nodes_lists_each_nodes_accelerators(tmp_path: Path) -> None:
    """ListNodes says whose chips a node has; an agent from before vendors is NVIDIA."""
    from dataclasses import dataclass

    from controller.query.nodes import node_statuses
    from controller.store import Store
    from starpulse.core.clock import FakeClock
    from starpulse.v1 import inventory_pb2 as ipb

    @dataclass
    class Row:
        node_id: str
        inventory: ipb.Inventory
        role: int = ipb.NODE_ROLE_COMPUTE
        state: str = "online"
        last_seen_ms: int = 0
        agent_version: str = ""
        hostname: str = ""

    amd = ipb.Inventory()
    amd.gpus.add(index=0, vendor="amd", model="AMD Instinct MI300X")
    old = ipb.Inventory()
    old.gpus.add(index=0, model="NVIDIA H100 80GB HBM3")
    rows = node_statuses(
        [Row("node-002", amd), Row("node-000", old), Row("leaf", ipb.Inventory())],
        Store(tmp_path / "s.db"),
        FakeClock(),
    )
    assert [(r.node_id, r.accelerator_vendor, r.accelerator_model) for r in rows] == [
        ("leaf", "", ""),
        ("node-000", "nvidia", "NVIDIA H100 80GB HBM3"),
        ("node-002", "amd", "AMD Instinct MI300X"),
    ]
