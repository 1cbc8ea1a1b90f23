"""`starpulse scan --backend sim --sim-fault` for every vendor's fault kinds, leaving nothing behind (issue 30)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.scan import STARPULSE, by_rule


def _scan(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    argv = [*STARPULSE, "scan", "--backend", "sim", "--window", "0.1", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False), scratch


@pytest.mark.parametrize(
    ("fault", "vendor", "rule", "component"),
    [
        ("amd_ras_uncorrectable:2", "amd", "gpu.ecc_dbe", "gpu-2"),
        ("amd_xgmi_down:1", "amd", "gpu.link_down", "gpu-1"),
        ("ascend_fault:3", "ascend", "gpu.accel_fault.reset_gpu", "gpu-3"),
    ],
)
def test_vendor_fault_on_a_node_of_that_vendor(
    tmp_path: Path, fault: str, vendor: str, rule: str, component: str
) -> None:
    """The simulated node gets the chips the fault needs; the fault is found, exit 1, no traceback."""
    proc, scratch = _scan(tmp_path, "--sim-fault", fault, "--node", "n1", "--json")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    data = json.loads(proc.stdout)
    assert {g["vendor"] for g in data["inventory"]["gpus"]} == {vendor}
    assert f"n1/{component}" in by_rule(data).get(rule, set()), data["verdict"]
    assert list(scratch.iterdir()) == []


def test_faults_of_two_vendors_are_one_line(tmp_path: Path) -> None:
    proc, _ = _scan(tmp_path, "--sim-fault", "amd_xgmi_down:1", "--sim-fault", "ascend_fault:2")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "starpulse scan: --sim-fault: one node has one vendor's chips, these faults need amd, ascend"
    ]


def test_sim_scan_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    """The simulated node's files (about 4 MB) are removed when the scan ends."""
    proc, scratch = _scan(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("fault", "rule", "words"),
    [
        ("nic_down:3", "nic.port_down", "n1/nic-3 (mlx5_3/1, ens4f0np0) is DOWN"),
        ("gpu_ecc_dbe:2", "gpu.ecc_dbe", "n1/gpu-2 (GPU 2, PCI 00000000:1B:00.0): "),
        ("ascend_fault:3", "gpu.accel_fault.reset_gpu", "n1/gpu-3 (NPU 3, PCI "),
    ],
)
def test_conditions_name_the_operators_device(tmp_path: Path, fault: str, rule: str, words: str) -> None:
    """Beside the fabric's name, the device as ibstat / ip link / nvidia-smi / npu-smi show it."""
    proc, _ = _scan(tmp_path, "--sim-fault", fault, "--node", "n1", "--json")
    conditions = [c for c in json.loads(proc.stdout)["verdict"]["conditions"] if c["rule"] == rule]
    assert conditions and conditions[0]["message"].startswith(words), conditions


def test_scan_json_numbers_are_numbers_and_zeros_stay(tmp_path: Path) -> None:
    """docs/json.md: 64-bit counters and times as JSON numbers, zero values present, unset optionals null."""
    proc, _ = _scan(tmp_path, "--json")
    data = json.loads(proc.stdout)
    sample = data["sample"]
    assert isinstance(sample["timestamp_ms"], int) and isinstance(sample["seq"], int)
    counters = sample["nics"][0]["counters"]
    assert all(isinstance(v, int) for v in counters.values()) and counters["symbol_error"] == 0
    assert [g["index"] for g in data["inventory"]["gpus"]][:2] == [0, 1]  # index 0 is not dropped
    assert sample["gpus"][0]["index"] == 0
    check = sample["accelerator_check"]
    assert check["expected"] is None and check["judged"] is True  # no expected inventory given: null, not 0
