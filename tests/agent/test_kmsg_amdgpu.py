"""amdgpu kernel-log lines: RAS uncorrectable, poison, ring timeouts and resets, with their actions.

The lines are written in the driver's own spellings (amdgpu_ras.c, amdgpu_job.c,
amdgpu_device.c), each in the /dev/kmsg, dmesg and journal forms the kernel-log parser reads.
"""

from __future__ import annotations

import pytest

from agent.collectors.kmsg import classify, scan_text

DEV = "amdgpu 0000:c1:00.0: amdgpu:"

FAULTS = [
    (f"{DEV} 2 uncorrectable hardware errors detected in umc block", "ecc_dbe", "reset_gpu", "UMC"),
    (f"{DEV} socket: 0 3 uncorrectable hardware errors detected in gfx block", "ecc_dbe", "reset_gpu", "GFX"),
    (
        f"{DEV} {{12}} socket: 0, die: 1, 4 new uncorrectable hardware errors detected in xgmi_wafl block",
        "ecc_dbe",
        "reset_gpu",
        "XGMI_WAFL",
    ),
    (
        "amdgpu 0000:c1:00.0: poison is consumed by client 5, kick off gpu reset flow",
        "accel_fault",
        "reset_gpu",
        "poison_consumed",
    ),
    (
        f"{DEV} ring gfx_0.0.0 timeout, signaled seq=163945, emitted seq=163947",
        "accel_fault",
        "restart_app",
        "ring_timeout",
    ),
    (f"{DEV} GPU reset begin!", "accel_fault", "restart_app", "gpu_reset"),
    (f"{DEV} GPU reset(2) failed", "accel_fault", "reboot", "gpu_reset_failed"),
]

BENIGN = [
    f"{DEV} no uncorrectable hardware errors detected in umc block",
    f"{DEV} 0 uncorrectable hardware errors detected in umc block",
    f"{DEV} 7 correctable hardware errors detected in umc block",
    "amdgpu 0000:02:00.0: amdgpu: Poison is created, no user action is needed.",
    f"{DEV} GPU reset succeeded, trying to resume",
    "[drm] PCIE GART of 512M enabled (table at 0x0000008000000000).",
]


@pytest.mark.parametrize(("line", "kind", "action", "code"), FAULTS)
def test_fault_lines(line: str, kind: str, action: str, code: str) -> None:
    finding = classify(line)
    assert finding is not None, line
    assert (finding.kind, finding.action, finding.vendor, finding.vendor_code) == (kind, action, "amd", code)
    assert finding.pci == "0000:c1:00.0" and finding.component == "gpu@0000:c1:00.0"


@pytest.mark.parametrize("line", BENIGN)
def test_benign_lines_give_nothing(line: str) -> None:
    assert classify(line) is None


def test_every_log_form_and_the_timeout_without_a_device() -> None:
    """/dev/kmsg, dmesg and journal forms of the same fault; the drm-prefixed timeout has no PCI id."""
    text = "\n".join(
        [
            f"3,2212,4053155111,-;{DEV} 2 uncorrectable hardware errors detected in umc block",
            f"[41394.501783] {DEV} GPU reset begin!",
            "Nov 01 16:52:04 host kernel: [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, "
            "signaled seq=22350749, emitted seq=22350752",
        ]
    )
    got = [(f.kind, f.vendor_code, f.component) for f in scan_text(text)]
    assert got == [
        ("ecc_dbe", "UMC", "gpu@0000:c1:00.0"),
        ("accel_fault", "gpu_reset", "gpu@0000:c1:00.0"),
        ("accel_fault", "ring_timeout", "gpu"),
    ]


def test_nvidia_lines_are_still_nvidias() -> None:
    finding = classify("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.")
    assert finding is not None and finding.xid == 79 and finding.vendor == ""
