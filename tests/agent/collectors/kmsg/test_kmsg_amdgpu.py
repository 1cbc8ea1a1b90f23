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
    "amdgpu 0000:02:00.0: amdgpu: Poison is created, no user action is needed.",
    f"{DEV} GPU reset succeeded, trying to resume",
    "[drm] PCIE GART of 512M enabled (table at 0x0000008000000000).",
]


def test_correctable_errors_are_recorded_without_an_action() -> None:
    """Corrected by the hardware (AMD: no action): a finding that opens nothing."""
    f = classify(f"{DEV} 7 correctable hardware errors detected in umc block")
    assert f is not None
    assert (f.kind, f.action, f.severity, f.vendor_code, f.attributes["block"]) == (
        "accel_fault",
        "none",
        "info",
        "ras_ce",
        "UMC",
    )


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


# -- multi-line records -----------------------------------------------------------------------


def test_a_vm_fault_burst_is_one_finding_naming_the_process() -> None:
    """Header, process line, address and decoded status, and the next fault of the same pasid: one finding."""
    p = "[ 2480.7277] amdgpu 0000:0e:00.0: amdgpu: "
    fault = [
        p + "[gfxhub] page fault (src_id:0 ring:173 vmid:8 pasid:32791)",
        p + " Process python3 pid 15615 thread python3 pid 15615",
        p + "  in page starting at address 0x00007febd6383000 from client 10",
        p + "GCVM_L2_PROTECTION_FAULT_STATUS:0x00841B5B",
        p + "\t MORE_FAULTS: 0x1",
    ]
    got = scan_text("\n".join(fault + fault))
    assert len(got) == 1
    f = got[0]
    assert (f.vendor_code, f.action, f.pci) == ("vm_fault", "restart_app", "0000:0e:00.0")
    assert (f.attributes["process"], f.attributes["pid"], f.attributes["pasid"], f.attributes["hub"]) == (
        "python3",
        "15615",
        "32791",
        "gfxhub",
    )


def test_a_fault_whose_process_line_never_comes_is_still_reported() -> None:
    p = "[ 1.0] amdgpu 0000:3d:00.0: amdgpu: "
    got = scan_text(
        p + "[mmhub0] retry page fault (src_id:0 ring:0 vmid:3 pasid:7)\n" + p + "  in page starting at address 0x0"
    )
    assert [(f.vendor_code, f.attributes.get("retry")) for f in got] == [("vm_fault", "retry")]


def test_an_aca_dump_is_one_finding_with_its_severity_and_explains_the_count_after_it() -> None:
    """Banks of one event fold; a worse bank reports again; the RAS count line names the banks behind it."""
    p = "[ 1.0] amdgpu 0000:9d:00.0: {1}[Hardware Error]: "
    bank = [p + "Accelerator Check Architecture events logged", p + "aca entry[00].STATUS=0xd820000000060150"]
    bank += [p + f"aca entry[00].{r}=0x0" for r in ("ADDR", "MISC0", "IPID", "SYND")]
    uc = [line.replace("0xd820000000060150", "0xbaa000000000080b") for line in bank]
    count = (
        "[ 1.1] amdgpu 0000:9d:00.0: {1}socket: 6, die: 1, 3 new uncorrectable hardware errors detected in umc block"
    )
    got = scan_text("\n".join(bank + bank + uc + [count]))
    assert [(f.vendor_code, f.action) for f in got] == [
        ("aca_corrected", "none"),
        ("aca_uncorrectable", "reset_gpu"),
        ("UMC", "reset_gpu"),
    ]
    assert got[2].attributes["aca_banks"] == "3" and got[2].attributes["aca_status"] == "0xbaa000000000080b"
    assert got[2].attributes["ras_event"] == "1"


def test_failures_inside_a_reset_fold_into_it_and_a_failed_reset_does_not() -> None:
    d = "amdgpu 0000:03:00.0:"
    log = [
        f"[ 1.0] {d} amdgpu: GPU reset begin!",
        f"[ 1.1] {d} [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_2.1.0 test failed (-110)",
        "[ 1.2] [drm:gfx_v10_0_hw_fini [amdgpu]] *ERROR* KGQ disable failed",
        f"[ 1.3] {d} amdgpu: MES failed to respond to msg=REMOVE_QUEUE",
        f"[ 1.4] {d} amdgpu: GPU reset(1) failed",
    ]
    assert [(f.vendor_code, f.action) for f in scan_text("\n".join(log))] == [
        ("gpu_reset", "restart_app"),
        ("gpu_reset_failed", "reboot"),
    ]


def test_a_lost_gpu_is_one_finding_whatever_fails_after() -> None:
    d = "[ 1.0] amdgpu 0000:0c:00.0: amdgpu:"
    log = [
        f"{d} SMU: response:0xFFFFFFFF for index:18 param:0x00000005 message:TransferTableSmu2Dram?",
        f"{d} Failed to export SMU metrics table!",
        f"{d} SMU: response:0xFFFFFFFF for index:7 param:0x00000000 message:DisableAllSmuFeatures?",
        "[ 1.1] amdgpu 0000:0c:00.0: [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_2.1.0 test failed (-110)",
    ]
    got = scan_text("\n".join(log))
    assert [(f.kind, f.vendor_code, f.action, f.pci) for f in got] == [
        ("gpu_lost", "smu_unreachable", "reboot", "0000:0c:00.0")
    ]


def test_a_device_naming_line_does_not_fold_into_another_devices_record() -> None:
    """A qcm timeout on a second GPU is its own finding, not part of the first one's."""
    log = [
        "[ 1.0] amdgpu 0000:01:00.0: qcm fence wait loop timeout expired",
        "[ 1.1] amdgpu 0000:02:00.0: qcm fence wait loop timeout expired",
    ]
    assert [f.pci for f in scan_text("\n".join(log))] == ["0000:01:00.0", "0000:02:00.0"]


def test_a_total_line_without_its_new_line_is_still_the_error() -> None:
    """A log that starts at the running total still shows the uncorrectable error once."""
    total = f"{DEV} {{2}}socket: 0, die: 0, 4 uncorrectable hardware errors detected in total in umc block"
    new = total.replace("4 uncorrectable", "4 new uncorrectable").replace(" in total in ", " in ")
    assert [f.vendor_code for f in scan_text(total)] == ["UMC"]
    assert [f.vendor_code for f in scan_text(new + "\n" + total)] == ["UMC"]


@pytest.mark.parametrize(
    "line",
    [
        "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout, but soft recovered",
        f"{DEV} GPU reset(3) succeeded!",
        f"{DEV} RAS: optional ras ta ucode is not available",
        f"{DEV} ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
        f"{DEV} SMU is initialized successfully!",
    ],
)
def test_recovery_and_boot_lines_give_nothing(line: str) -> None:
    assert classify(line) is None
