"""Kernel log: parse /dev/kmsg, dmesg and journalctl text, and turn error lines into findings.

NVML reports an Xid number; the kernel log has the text around it (PCI address, process,
sub-codes), plus things NVML never sees: NVSwitch SXids, mlx5 NIC driver errors and
nvidia-peermem failures. One parser reads every shape an operator might hand us, so the
agent's live tail and ``starpulse scan --kmsg FILE`` agree on what a line means.

    lines   line shapes -> KernelRecord
    family  what a pattern family is (matchers per driver)
    nvidia  Xid / fallen off the bus / SXid / peermem
    mlx5    ConnectX driver faults
    amdgpu  AMD GPU driver faults (RAS, poison, resets, ring timeouts)
    ascend  Huawei Ascend NPU driver faults (heartbeat, device loss, TS exceptions, fault events)
    reader  families in order, with per-log state -> findings
    tail    the collector that follows /dev/kmsg or a file
"""

from agent.collectors.kmsg.lines import KernelRecord, numbered_records, parse_line, parse_lines
from agent.collectors.kmsg.reader import (
    FAMILIES,
    LogReader,
    classify,
    classify_record,
    scan_file,
    scan_numbered,
    scan_text,
)
from agent.collectors.kmsg.tail import KmsgCollector

__all__ = [
    "FAMILIES",
    "KernelRecord",
    "KmsgCollector",
    "LogReader",
    "classify",
    "classify_record",
    "numbered_records",
    "parse_line",
    "parse_lines",
    "scan_file",
    "scan_numbered",
    "scan_text",
]
