"""The AMD Instinct backend against FakeAmdSmi, and `--backend amd` without the library."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.collectors.accel.amd import AmdGpuCollector, amdsmi_unavailable_reason
from agent.collectors.accel.base import AcceleratorBackend
from agent.sim.fake_amdsmi import MI300X_MARKET_NAME, MI300X_XGMI_LINKS, FakeAmdSmi
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

ROOT = Path(__file__).resolve().parents[4]


def started(gpus: int = 8) -> tuple[FakeAmdSmi, AmdGpuCollector]:
    smi = FakeAmdSmi(gpu_count=gpus)
    collector = AmdGpuCollector(smi)
    assert collector.supported()
    return smi, collector


def cycle(collector: AmdGpuCollector) -> tuple[tpb.Report, list]:  # type: ignore[type-arg]
    report = tpb.Report()
    return report, collector.collect(report)


class TestAmdBackend:
    def test_is_an_accelerator_backend(self) -> None:
        assert isinstance(AmdGpuCollector(FakeAmdSmi()), AcceleratorBackend)

    def test_inventory_names_vendor_model_bus_and_links(self) -> None:
        _, collector = started()
        inv = ipb.Inventory()
        collector.describe(inv)
        assert len(inv.gpus) == 8
        g = inv.gpus[0]
        assert (g.vendor, g.interconnect, g.model) == ("amd", "xgmi", MI300X_MARKET_NAME)
        assert g.pci_bus_id == "0000:0c:00.0" and g.uuid and g.serial
        assert g.link_count == MI300X_XGMI_LINKS and g.nvlink_count == 0
        assert g.memory_total_bytes == 196_592 * 1024 * 1024
        assert inv.host.driver_version == "6.10.5"

    def test_healthy_sample_fills_the_neutral_fields_and_leaves_na_absent(self) -> None:
        smi, collector = started(1)
        smi.gpus[0].unsupported.add("amdsmi_get_violation_status")
        report, findings = cycle(collector)
        assert findings == []
        g = report.gpus[0]
        assert g.temperature_c == 55 and g.memory_temperature_c == 50
        assert g.power_w == 320 and g.power_limit_w == 750
        assert g.utilization_gpu_pct == 80 and g.sm_clock_mhz == 2100 and g.memory_clock_mhz == 1300
        assert g.memory_errors_uncorrectable == 0
        assert {b.block for b in g.ras_blocks} >= {"UMC", "XGMI_WAFL"}
        assert [link.up for link in g.links] == [True] * MI300X_XGMI_LINKS
        assert not g.HasField("thermal_slowdown")  # NOT_SUPPORTED: absent, never False
        assert not g.HasField("ecc_dbe_volatile") and not g.nvlinks  # NVIDIA's fields stay NVIDIA's

    def test_umc_uncorrectable_is_one_shared_memory_finding(self) -> None:
        smi, collector = started(2)
        cycle(collector)
        smi.inject_ecc(1, smi.AmdSmiGpuBlock.UMC, uncorrectable=2)
        report, findings = cycle(collector)
        assert [(f.kind, f.component, f.action, f.vendor, f.vendor_code) for f in findings] == [
            ("ecc_dbe", "gpu-1", "reset_gpu", "amd", "UMC")
        ]
        assert findings[0].severity == "critical" and findings[0].pci == "0000:22:00.0"
        assert report.gpus[1].memory_errors_uncorrectable == 2
        assert cycle(collector)[1] == []  # a steady count is reported once

    def test_xgmi_link_down_thermal_and_lost(self) -> None:
        smi, collector = started(3)
        cycle(collector)
        smi.set_xgmi_link(0, 3, up=False)
        smi.set_thermal(1, True)
        smi.lose(2)
        report, findings = cycle(collector)
        # Lost is an event; a link down and a slowdown are states every report carries (the
        # controller's gpu.link_down and gpu.thermal_slowdown read them).
        assert [(f.kind, f.component, f.action) for f in findings] == [("gpu_lost", "gpu-2", "reboot")]
        assert report.gpus[2].lost and report.gpus[1].thermal_slowdown and not report.gpus[0].thermal_slowdown
        assert report.gpus[0].links_down == 1 and not report.gpus[0].links[3].up
        assert report.gpus[1].links_down == 0 and report.gpus[1].HasField("links_down")

    def test_driver_not_loaded_is_one_line(self) -> None:
        reason = amdsmi_unavailable_reason(FakeAmdSmi(driver_missing=True))
        assert reason is not None and "\n" not in reason and "DRIVER_NOT_LOADED" in reason


@pytest.mark.parametrize("command", ["scan", "agent"])
def test_backend_amd_without_the_library_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    """No amdsmi here: the command says so in one line, no traceback, exit status 2."""
    if importlib.util.find_spec("amdsmi") is not None:
        pytest.skip("amdsmi is installed here: the one-line refusal is for hosts without it")
    args = [sys.executable, "-m", "starpulse.app.cli", command, "--backend", "amd"]
    if command == "agent":
        args += ["--node-id", "node-001", "--controller", "127.0.0.1:1", "--state-dir", str(tmp_path)]
    proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "backend amd unavailable" in lines[0] and "amdsmi" in lines[0]


@pytest.mark.parametrize("error", ["OSError('libamd_smi.so: cannot open shared object file')", "KeyError('ROCM_PATH')"])
def test_amdsmi_installed_without_rocm_is_one_line(error: str, tmp_path: Path) -> None:
    """The real package raises OSError or KeyError at import without ROCm: still one line, exit 2."""
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"raise {error}\n")  # what amdsmi_wrapper does when it cannot load the library
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "scan", "--backend", "amd"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot load libamd_smi.so" in lines[0] and "ROCm" in lines[0], proc.stderr
