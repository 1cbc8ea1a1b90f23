"""The Ascend kernel-log family on lines beyond the corpus: other modules, repeats, recoveries, codes."""

from __future__ import annotations

from agent.collectors.kmsg import scan_text
from agent.collectors.kmsg.ascend import classify_ascend
from agent.collectors.kmsg.ascend_base import parse

ERR = "[ascend] [ERROR]"


def test_the_parts_of_a_driver_line_in_every_build() -> None:
    """drv_err's, the host-log build's [WARN] and a trimmed quote all give module, function and device."""
    line = parse(f"{ERR} [dms_module] [hb_urgent 399] <kw:1,1> The device urgent heartbeat is lost! (device=5)")
    assert line is not None and (line.module, line.function, line.device, line.error) == (
        "dms_module",
        "hb_urgent",
        "5",
        True,
    )
    line = parse(
        "[ascend] [dms_module] [WARN] [dms_event_get_fault_event 394] read fault event success.(dev_id=4; event_id=0x1)"
    )
    assert line is not None and (line.module, line.device, line.error) == ("dms_module", "4", False)
    line = parse("[ascend] [devdrv] devdrv_imu_mbx3_notifier  Get mntn message. (exception_id=0xa6193215; ...)")
    assert line is not None and (line.module, line.function, line.device) == ("devdrv", "", "")
    assert "Get mntn message" in line.rest
    assert parse("amdgpu 0000:c1:00.0: amdgpu: ring gfx timeout") is None


def test_a_heartbeat_lost_in_any_module_wording_is_a_chip_reset() -> None:
    for text in (
        "[ascend] [devdrv] [devdrv_refresh_aicore_info 340] (Device=7 heart beat is lost, stop send h2d message",
        f"{ERR} [drv_soft_fault] [hb_read_one_device_count 203] <k:1,1> Heartbeat lost! (device_id=7; lost_count=3).",
        f"{ERR} [ubdrv] [ubdrv_hb_lost_proc 1092] Device heart beat lost, stop all msg send. (udevid=7)",
    ):
        f = classify_ascend(text)
        assert f is not None, text
        assert (f.vendor_code, f.action, f.attributes["device"], f.component) == (
            "heartbeat_lost",
            "reset_gpu",
            "7",
            "gpu-7",
        )


def test_one_loss_is_one_finding_until_the_driver_recovers_the_device() -> None:
    """The loss and every message failure after it are one event; after 'fault recover' a new loss is new."""
    loss = f"{ERR} [drv_soft_fault] [hb_read_one_device_count 203] <k:1,1> Heartbeat lost! (device_id=2; lost_count=3)."
    abnormal = (
        "[ascend] [drv_pcie] [devdrv_sync_non_trans_msg_send 1239] <k:1:1> Device is abnormal. (dev_id=2; msg_type=3)"
    )
    recover = "[ascend] [drv_soft_fault] [soft_fault_event_handler 357] <k:1,1> fault recover. (dev_id=2; user_id=2)"
    found = scan_text("\n".join([loss, abnormal, abnormal, loss, recover, loss]))
    assert [f.vendor_code for f in found] == ["heartbeat_lost", "heartbeat_lost"]


def test_devices_are_kept_apart() -> None:
    """A message failure of another device is that device's own fault, not part of the first loss."""
    loss = f"{ERR} [drv_soft_fault] [hb_read_one_device_count 203] <k:1,1> Heartbeat lost! (device_id=0; lost_count=3)."
    other = "[ascend] [drv_pcie] [devdrv_msg_send 1869] Device is abnormal. (dev_id=6; msg_type=2)"
    found = scan_text(f"{loss}\n{other}\n")
    assert [(f.vendor_code, f.attributes["device"]) for f in found] == [
        ("heartbeat_lost", "0"),
        ("device_abnormal", "6"),
    ]


def test_fault_events_take_their_mindcluster_level() -> None:
    """The shipped table decides: RestartNPU resets the chip, an unlisted code isolates it; a clear is silent."""
    head = "[ascend] [dms_module] [dms_event_get_fault_event 394] <d:1,1> read fault event success."
    f = classify_ascend(f"{head}(dev_id=3; event_id=0x80e18005; start=1; end=2)")
    assert f is not None and (f.vendor_code, f.action, f.attributes["level"]) == ("80E18005", "reset_gpu", "RestartNPU")
    f = classify_ascend(f"{head}(dev_id=3; event_id=0x80e01801; start=1; end=2)")
    assert f is not None and f.action == "restart_app"
    f = classify_ascend(f"{head}(dev_id=3; event_id=0x12345678; start=1; end=2)")
    assert f is not None and (f.action, f.attributes["level"]) == ("contact_support", "SeparateNPU")
    assert classify_ascend("[ascend] [dms_module] [x 1] event recovered. (dev_id=3; event_id=0x80e18005)") is None


def test_bookkeeping_and_follow_on_lines_alone_stay_silent() -> None:
    for text in (
        "[ascend] [devmm] [devmm_free_svm_proc 276] <k:1,1> Devmm_free_process details. (hostpid=-1; devid=64)",
        "[ascend] [devdrv] [devdrv_refresh 322] <k:1> devdrv_manager_send_msg unsuccessful. (ret=-19; dev_id=5)",
        "[ascend] [icm] icm_ipc_msg_send_sync Wait event timeout (chan_id=13, wait_time=30000)",
        "[ascend] [drv_soft_fault] [log_hb_debug 99] <k:1,1> heart beat debug info. (lost count=1; total lost count=1)",
        "[ascend] [drv_pcie] [devdrv_hot_reset_device 5827] Pcie hotreset, rescan device. (bdf=c1:00.0; dev_num=8)",
    ):
        assert classify_ascend(text) is None, text


def test_driver_wordings_beyond_the_corpus() -> None:
    """TS exception messages, AI Core/CPU exceptions and devices written as dev_id(N)."""
    f = classify_ascend(
        "[ascend] [ERROR] [devdrv] [devdrv_chan_msg 55] <k:1,1> receive ts exception message from device(6)."
    )
    assert f is not None and (f.vendor_code, f.action, f.attributes["device"]) == ("ts_exception", "reset_gpu", "6")
    f = classify_ascend(
        "[ascend] [ERROR] [devdrv] [devdrv_update_ai 265] <k:1,1> receive message ai core: 12 exception. dev_id(2)"
    )
    assert f is not None
    assert (f.vendor_code, f.action, f.attributes["device"], f.attributes["core"]) == (
        "ai_core_exception",
        "investigate",
        "2",
        "12",
    )
    f = classify_ascend(
        "[ascend] [ERROR] [devdrv] [x 245] <k:1,1> receive message ai cpu: 3 heart beat exception. dev_id(2)"
    )
    assert f is not None and (f.vendor_code, f.attributes["core"]) == ("ai_cpu_exception", "3")


def test_hdc_session_resets_fold_into_the_loss_and_are_silent_alone() -> None:
    loss = f"{ERR} [drv_soft_fault] [hb_read 203] <k:1,1> Heartbeat lost! (device_id=1; lost_count=3)."
    reset = "[ascend] [ERROR] [hdcdrv] [hdcdrv_rx_msg_notify 3263] Rx msg notify device reset. (dev_id=1)"
    assert [f.vendor_code for f in scan_text(f"{loss}\n{reset}\n{reset}\n")] == ["heartbeat_lost"]
    assert classify_ascend(reset) is None
