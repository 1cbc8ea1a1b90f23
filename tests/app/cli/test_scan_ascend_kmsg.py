"""`starpulse scan --kmsg` on an Ascend node's kernel log: the rules judge the Ascend findings.

A node whose NPU lost its heartbeat, or whose fault event MindCluster files as 'reset the chip',
must not scan healthy; the driver's process bookkeeping and a NotHandleFault event leave it in
service.
"""

from __future__ import annotations

from pathlib import Path

from tests.app.cli.test_scan_verdict import by_rule, scan

LOSS = "[ 9.1] [ascend] [ERROR] [drv_soft_fault] [hb_read 203] <k:1,1> Heartbeat lost! (device_id=3; lost_count=3)."
EVENT = "[ 9.2] [ascend] [dms_module] [dms_event_get 394] <d:1,1> read fault event success.(dev_id=4; event_id={})"


def test_a_lost_heartbeat_makes_the_node_unhealthy(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(f"{LOSS}\n{EVENT.format('0x80e18005')}\n")
    rc, data, err = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert "gpu.accel_fault.reset_gpu" in by_rule(data), (data.get("verdict"), err)
    assert rc == 1 and data["verdict"]["status"] != "healthy"


def test_bookkeeping_and_a_no_handling_event_scan_healthy(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[ 2.1] [ascend] [devmm] [devmm_svm_release_proc 617] <r:1,1> Devmm release create work. (hostpid=-1)\n"
        "[ 2.2] [ascend] [drv_soft_fault] [soft_event_init 736] <insmod:1,1> soft event driver init success.\n"
        f"{EVENT.format('0x80e21007')}\n"
    )
    rc, data, _ = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert rc == 0 and data["verdict"]["status"] == "healthy"
