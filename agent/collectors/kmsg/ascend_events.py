"""Ascend fault events and black-box exceptions in the kernel log: each code's documented handling.

The driver's device-management module logs each fault event it hands to a reader
(``read fault event success.(dev_id=4; event_id=0x80e18005; ...)``), and the device's own logs
print the same DCMI codes (``event_id: [0x80E01809]``, ``Event id=0x80c78008``). The code is
looked up in MindCluster's table shipped with the agent (``accel/ascend_fault_levels.json``):
RestartNPU and FreeRestartNPU reset the chip, RestartRequest and RestartBusiness re-run the job,
NotHandleFault is recorded with no action, and a code MindCluster does not list is SeparateNPU,
as MindCluster handles unknown codes above Minor. A line that clears or recovers an event is not
a fault.

The host's black-box thread logs each device exception it collects (``Exception code: 0x...``,
and the TS's ``Get mntn message. (exception_id=0x...)`` where that one is read as a hang, see
``ascend``). Huawei's guidance for a black-box exception is to export the black box
(msnpureport) and look the code up: investigate (our word for it).
"""

from __future__ import annotations

import re

from agent.collectors.accel import ascend_faults as faults
from agent.collectors.kmsg.ascend_base import AscendLine, finding
from starpulse.core import vocab
from starpulse.core.findings import Finding

_EVENT_RE = re.compile(r"\bevent[_ ]id\s*[:=]\s*\[?0x(?P<code>[0-9a-fA-F]{1,8})\b", re.IGNORECASE)
_CLEARED_RE = re.compile(r"\b(?:recover(?:ed|y)?|resumed?|clear(?:ed)?)\b", re.IGNORECASE)
_BBOX_RE = re.compile(r"\bException code:\s*0x(?P<code>[0-9a-fA-F]+)")


def match_event(line: AscendLine) -> Finding | None:
    """A DCMI fault event with the action of its MindCluster level; None for other lines."""
    m = _EVENT_RE.search(line.rest)
    if m is None or _CLEARED_RE.search(line.rest):
        return None
    code = m.group("code").upper().rjust(8, "0")
    # The kernel line carries no alarm grade: an unlisted code is handled as above Minor.
    level = faults.level_of(code, faults.default_levels(), "critical")
    action = faults.LEVEL_ACTION[level]
    where = f"NPU device {line.device}" if line.device else "an NPU"
    message = f"Ascend fault event {code} on {where} (MindCluster level {level})"
    return finding(code, action, message, line.device, {"level": level})


def match_bbox(line: AscendLine) -> Finding | None:
    """A device exception the host's black box collected; None for other lines."""
    m = _BBOX_RE.search(line.rest)
    if m is None:
        return None
    code = "0x" + m.group("code").lower()
    message = f"Ascend black-box exception {code}: export the device's black box (msnpureport) and look it up"
    return finding("bbox_exception", vocab.ACTION_INVESTIGATE, message, line.device, {"exception": code})
