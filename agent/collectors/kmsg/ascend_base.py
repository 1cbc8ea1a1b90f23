"""What every Ascend pattern needs: the parts of a driver line, the device it names, the finding.

Huawei's Ascend driver prints every kernel message as ``[ascend] [ERROR] [module] [function line]
<comm:tgid,pid> text`` (errors; ``drv_err``), ``[ascend] [module] [function line] text`` (other
levels) or, in builds that keep a host log, ``[ascend] [module] [WARN] [function line] text``.
People quote the lines trimmed (``[ascend] [devdrv] devdrv_imu_mbx3_notifier  Get mntn ...``), and
the device side's ``sklogd`` puts its own prefix in front; the parser takes whatever of the parts
is there. The device is a number in the text (``dev_id=3``, ``device_id=3``, ``(device=5)``,
``udevid=12``, ``Device=3``, ``dev_id(3)``, ``device(3)``): the driver's device id, which on a
host is the chip's logical id, the index npu-smi and the Ascend backend give it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.collectors.kmsg.family import SOURCE
from starpulse.core import vocab
from starpulse.core.findings import Finding

VENDOR = "ascend"

_HEAD_RE = re.compile(
    r"\[ascend\]\s*(?:\[(?P<err>ERROR)\]\s*)?(?:\[(?P<module>[A-Za-z][\w.-]*)\]\s*)?"
    r"(?:\[(?:ERROR|WARN|WARNING|INFO|NOTICE|EVENT|DEBUG)\]\s*)?(?:\[(?P<func>\w+)\s+\d+\]\s*)?"
    r"(?:<[^>]*>\s*)?(?P<rest>.*)$"
)
_DEVICE_RE = re.compile(
    r"\b(?:dev_id|device_id|devid|udevid|dev|device|Device|index_id)\s*(?:[=:]\s*(?P<n>\d+)|\((?P<p>\d+)\))"
    r"|\(dev (?P<m>\d+);"
)


@dataclass(frozen=True)
class AscendLine:
    """One driver line in parts: module, function, the text after them, the device ('' for none)."""

    module: str
    function: str
    rest: str
    device: str
    error: bool


def parse(message: str) -> AscendLine | None:
    """The parts of an ``[ascend]`` line; None for any other line."""
    m = _HEAD_RE.search(message)
    if m is None:
        return None
    rest = m.group("rest")
    dev = _DEVICE_RE.search(rest)
    device = (dev.group("n") or dev.group("p") or dev.group("m")) if dev is not None else ""
    return AscendLine(m.group("module") or "", m.group("func") or "", rest, device, m.group("err") is not None)


def finding(code: str, action: str, message: str, device: str, attrs: dict[str, str] | None = None) -> Finding:
    """One Ascend kernel-log finding about ``device`` (the chip index), graded by its action."""
    attributes = dict(attrs or {})
    if device:
        attributes["device"] = device
    return Finding(
        kind="accel_fault",
        component=f"gpu-{device}" if device else "gpu",
        severity=vocab.severity_for_action(action),
        action=action,
        message=message,
        source=SOURCE,
        attributes=attributes,
        vendor=VENDOR,
        vendor_code=code,
    )
