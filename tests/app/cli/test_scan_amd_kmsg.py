"""`starpulse scan --kmsg` on an AMD node's kernel log: the rules judge the amdgpu findings.

A node whose log holds an uncorrectable RAS error, or a GPU that fell off the bus, must not scan
healthy; a VM fault of one process and a corrected error leave it in service.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scan import by_rule, scan

DEV = "amdgpu 0000:c1:00.0:"
VM_FAULT = "[gfxhub] page fault (src_id:0 ring:24 vmid:8 pasid:32770, for process python pid 1 thread python pid 1)"


@pytest.mark.parametrize(
    ("lines", "rule", "code"),
    [
        (
            [f"[ 9.1] {DEV} {{3}}socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block"],
            "gpu.ecc_dbe",
            1,
        ),
        ([f"[ 9.1] {DEV} amdgpu: 2 uncorrectable hardware errors detected in umc block"], "gpu.ecc_dbe", 1),
        ([f"[ 9.1] {DEV} amdgpu: device lost from bus!"], "gpu.lost", 1),
        (
            [
                f"[ 9.1] {DEV} {{1}}[Hardware Error]: Accelerator Check Architecture events logged",
                f"[ 9.1] {DEV} {{1}}[Hardware Error]: aca entry[00].STATUS=0xbaa000000000080b",
            ],
            "gpu.accel_fault.reset_gpu",
            1,
        ),
        (
            [f"[ 9.1] {DEV} amdgpu: {VM_FAULT}"],
            "gpu.accel_fault.restart_app",
            0,
        ),
    ],
)
def test_amd_kernel_log_faults_judged_by_the_rules(tmp_path: Path, lines: list[str], rule: str, code: int) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(lines) + "\n")
    rc, data, err = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert rule in by_rule(data), (data.get("verdict"), err)
    assert rc == code
    if code:
        assert data["verdict"]["status"] != "healthy"


def test_boot_noise_and_corrected_errors_scan_healthy(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(
        f"[ 6.5] {DEV} amdgpu: RAS: optional ras ta ucode is not available\n"
        f"[ 8.1] {DEV} amdgpu: SMU is initialized successfully!\n"
        "[ 8.2] [drm] Initialized amdgpu 3.58.0 20150101 for 0000:c1:00.0 on minor 1\n"
        f"[ 9.1] {DEV} amdgpu: 3 correctable hardware errors detected in umc block\n"
    )
    rc, data, _ = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert rc == 0 and data["verdict"]["status"] == "healthy"
