"""Every npu-smi layout through the real Ascend backend: the fake prints each product line's table.

910A narrow, 910B, the A3's two chips per NPU, 310P duo cards and 310B SoCs whose bus id is NA:
each is read through the real collector (inventory, samples, a fault's health query by NPU and
chip id and its MindCluster action), through a simulated node, and through ``starpulse scan
--backend ascend`` with the fake as the ``npu-smi`` on PATH. The public outputs of each layout
(tests/fixtures/ascend/npu-smi/) are checked chip by chip.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from agent.collectors.accel.ascend import AscendNpuCollector
from agent.collectors.accel.ascend_parse import parse_npu_smi_info
from agent.sim.fake_npu_smi import LAYOUTS, FakeNpuSmi
from agent.sim.node import SimNode
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.app.cli.test_scan_verdict import by_rule, scan
from tests.test_mixed_fleet import one_cycle

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "ascend" / "npu-smi"
ROOT = Path(__file__).resolve().parents[4]
# layout -> (chips per NPU, model in the inventory, has a PCI address, has HBM)
SHAPES = {
    "910B": (1, "Ascend 910B4", True, True),
    "910A": (1, "Ascend 910A", True, True),
    "A3": (2, "Ascend910", True, True),
    "310P": (2, "Ascend 310P3", True, False),
    "310B": (1, "Ascend 310B", False, False),
}


def test_every_layout_has_a_shape() -> None:
    assert set(SHAPES) == set(LAYOUTS)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("info.*.txt")), ids=lambda p: p.name)
def test_public_outputs_of_each_layout(path: Path) -> None:
    """Each chip of a public output: ids, model, bus id as printed, health, memory."""
    want = json.loads(path.with_suffix(".expect.json").read_text())
    chips = parse_npu_smi_info(path.read_text())
    assert len(chips) == want["chip_count"]
    for chip, dev in zip(chips, want["devices"], strict=True):
        got = (chip.npu_id, chip.chip_id, chip.model, chip.bus_id, chip.health)
        assert got == (dev["npu_id"], dev["chip_id"], dev["model"], dev["bus_id"], dev["health"])
        if "memory_total_mb" in dev:
            assert (chip.memory_used_mb, chip.memory_total_mb) == (dev["memory_used_mb"], dev["memory_total_mb"])
            assert chip.device_memory_mb == (dev["memory_used_mb"], dev["memory_total_mb"])
        if "hbm_total_mb" in dev:
            assert (chip.hbm_used_mb, chip.hbm_total_mb) == (dev["hbm_used_mb"], dev["hbm_total_mb"])
        if "device_id" in dev:
            assert chip.phy_id == dev["device_id"]
        assert chip.power_w == dev.get("power_w", chip.power_w)
    if path.name.startswith("info.310B"):
        assert chips[0].pci == ""  # NA is no PCI address: never "na" in the inventory


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_through_the_real_collector(layout: str) -> None:
    """Inventory and samples of every chip; a fault on the last chip is asked by its NPU and chip id."""
    per, model, has_pci, _hbm = SHAPES[layout]
    fake = FakeNpuSmi(npu_count=4, layout=layout)
    collector = AscendNpuCollector(fake)
    assert collector.supported()
    inv = ipb.Inventory()
    collector.describe(inv)
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3]
    assert {g.model for g in inv.gpus} == {model}
    assert all(g.memory_total_bytes > 0 for g in inv.gpus)
    assert all(bool(g.pci_bus_id) == has_pci for g in inv.gpus)
    assert [g.serial for g in inv.gpus] == [f"npu{i // per}-chip{i % per}" for i in range(4)]
    fake.inject(3, "80E18005")  # HBMC parity error: RestartNPU
    report = tpb.Report()
    found = collector.collect(report)
    assert len(report.gpus) == 4 and all(g.memory_total_bytes > 0 for g in report.gpus)
    (f,) = found
    assert (f.component, f.vendor_code, f.action) == ("gpu-3", "80E18005", "reset_gpu")
    assert (f.attributes["npu"], f.attributes["chip"]) == (str(3 // per), str(3 % per))
    assert ["npu-smi", "info", "-t", "health", "-i", str(3 // per), "-c", str(3 % per)] in fake.calls


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_on_a_simulated_node(layout: str, tmp_path: Path) -> None:
    """The agent's own collector set on a simulated node of that layout."""
    sim = SimNode("node-004", tmp_path, gpus=2, nics=1, vendor="ascend", npu_layout=layout)
    inventory, findings = one_cycle(sim)
    assert len(inventory.gpus) == 2 and findings == []
    sim.inject("ascend_fault", "gpu-1", code=0x80E01801)  # HBM multi-bit ECC on access: RestartBusiness
    _, findings = one_cycle(sim)
    assert [(f.component, f.action) for f in findings] == [("gpu-1", "restart_app")]


def _npu_smi_on_path(tmp_path: Path, *flags: str) -> dict[str, str]:
    """An environment whose PATH has the fake npu-smi (with ``flags``) first."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    tool = bindir / "npu-smi"
    tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agent.sim.fake_npu_smi {" ".join(flags)} "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.mark.parametrize("layout", ["A3", "310P", "310B"])
def test_scan_reads_each_layout_from_the_tool_on_path(layout: str, tmp_path: Path, monkeypatch) -> None:
    """`starpulse scan --backend ascend` runs the npu-smi it finds: healthy chips, then a fault to reset."""
    per = SHAPES[layout][0]
    for key, value in _npu_smi_on_path(tmp_path, "--layout", layout, "--chips", "4").items():
        monkeypatch.setenv(key, value)
    empty = tmp_path / "sys"
    empty.mkdir()
    rc, data, err = scan("--backend", "ascend", "--sysfs-root", str(empty))
    assert len(data["inventory"]["gpus"]) == 4, err
    assert data["verdict"]["status"] == "healthy" and rc == 0, (data["verdict"], err)
    for key, value in _npu_smi_on_path(tmp_path, "--layout", layout, "--chips", "4", "--fault", "3:80E18005").items():
        monkeypatch.setenv(key, value)
    rc, data, err = scan("--backend", "ascend", "--sysfs-root", str(empty))
    assert "gpu.accel_fault.reset_gpu" in by_rule(data), (data.get("verdict"), err)
    (f,) = [f for f in data["findings"] if f["kind"] == "accel_fault"]
    assert (f["attributes"]["npu"], f["attributes"]["chip"]) == (str(3 // per), str(3 % per))
    assert rc == 1


def test_health_codes_however_they_are_written() -> None:
    """Space separated as printed, with a 0x or commas as some versions and quotes add them."""
    from agent.collectors.accel.ascend_parse import parse_npu_health

    text = "\tHealth status : Critical\n\tError code : 0x80E18005, 8c03a000\n\tError information : HBM\n"
    health = parse_npu_health(text)
    assert (health.health, health.error_codes, health.error_information) == (
        "critical",
        ["80E18005", "8C03A000"],
        ["HBM"],
    )
    assert parse_npu_health("\tHealth Status : OK\n\tError Code : NA\n").error_codes == []


def test_an_alarm_without_a_code_is_still_a_finding() -> None:
    """npu-smi says Alarm but lists no code: the chip is looked at, once, not passed over."""
    fake = FakeNpuSmi(npu_count=2)
    fake.npus[1].health = "Alarm"
    collector = AscendNpuCollector(fake)
    (f,) = collector.collect(tpb.Report())
    assert (f.component, f.vendor_code, f.action) == ("gpu-1", "health_alarm", "investigate")
    assert collector.collect(tpb.Report()) == []


def test_tables_not_seen_before_still_give_their_chips() -> None:
    """A quote with its spaces collapsed, a Phy-ID printed '-', a model with a space, readings 'NA'."""
    collapsed = (
        "| NPU Name | Health | Power(W) Temp(C) Hugepages-Usage(page)|\n"
        "| Chip | Bus-Id | AICore(%) Memory-Usage(MB) HBM-Usage(MB) |\n"
        "| 0 310P3 | OK | 89.2 39 0 / 0 |\n"
        "| 0 | 0000:81:00.0 | 0 0 / 0 1460/ 44280 |\n"
    )
    (chip,) = parse_npu_smi_info(collapsed)
    assert (chip.model, chip.bus_id, chip.power_w, chip.hbm_used_mb, chip.hbm_total_mb) == (
        "310P3",
        "0000:81:00.0",
        89.2,
        1460,
        44280,
    )
    odd = (
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n"
        "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |\n"
        "| 4     Ascend 910B3        | UNKNOWN       | NA          NA                NA   / NA            |\n"
        "| 0     -                   | 0000:41:00.0  | NA          NA   / NA         NA   / NA            |\n"
    )
    (chip,) = parse_npu_smi_info(odd)
    assert (chip.npu_id, chip.chip_id, chip.phy_id, chip.model, chip.health) == (4, 0, None, "Ascend 910B3", "unknown")
    assert (chip.power_w, chip.aicore_pct, chip.device_memory_mb) == (None, None, (0, 0))
